"""metrale.sizes is metrale._sizing.sizes, the same module (documented there)."""
import sys
from ._sizing import sizes
sys.modules[__name__] = sizes
