from metrale._sizing.minimal import *
from metrale._sizing.minimal import __all__ as __all__
