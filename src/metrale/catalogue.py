"""metrale.catalogue is metrale._sizing.catalogue, the same module (documented there)."""
import sys
from ._sizing import catalogue
sys.modules[__name__] = catalogue
