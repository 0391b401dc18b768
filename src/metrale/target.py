"""metrale.target is metrale._sizing.target, the same module (documented there)."""
import sys
from ._sizing import target
sys.modules[__name__] = target
