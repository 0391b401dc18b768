"""metrale.minimal is metrale._sizing.minimal, the same module (documented there)."""
import sys
from ._sizing import minimal
sys.modules[__name__] = minimal
