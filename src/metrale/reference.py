"""metrale.reference is metrale._sizing.reference, the same module (documented there)."""
import sys
from ._sizing import reference
sys.modules[__name__] = reference
