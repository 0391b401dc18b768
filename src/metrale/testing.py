"""metrale.testing is metrale._backends.testing, the same module (documented there)."""
import sys
from ._backends import testing
sys.modules[__name__] = testing
