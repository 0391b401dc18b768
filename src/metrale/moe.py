"""metrale.moe is metrale._sizing.moe, the same module (documented there)."""
import sys
from ._sizing import moe
sys.modules[__name__] = moe
