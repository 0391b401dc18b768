"""metrale.fitting is metrale._integrations.fitting, the same module (documented there)."""
import sys
from ._integrations import fitting
sys.modules[__name__] = fitting
