"""metrale.config is metrale._sizing.config, the same module (documented there)."""
import sys
from ._sizing import config
sys.modules[__name__] = config
