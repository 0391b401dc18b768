from metrale._sizing.reference import *
from metrale._sizing.reference import __all__ as __all__
