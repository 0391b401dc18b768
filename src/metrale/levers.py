"""metrale.levers is metrale._sizing.levers, the same module (documented there)."""
import sys
from ._sizing import levers
sys.modules[__name__] = levers
