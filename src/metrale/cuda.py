"""metrale.cuda is metrale._backends.cuda, the same module (documented there)."""
import sys
from ._backends import cuda
sys.modules[__name__] = cuda
