"""metrale.buffers is metrale._sizing.buffers, the same module (documented there)."""
import sys
from ._sizing import buffers
sys.modules[__name__] = buffers
