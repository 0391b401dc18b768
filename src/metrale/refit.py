"""metrale.refit is metrale._integrations.refit, the same module (documented there)."""
import sys
from ._integrations import refit
sys.modules[__name__] = refit
