"""metrale.debug is metrale._sizing.debug, the same module (documented there)."""
import sys
from ._sizing import debug
sys.modules[__name__] = debug
