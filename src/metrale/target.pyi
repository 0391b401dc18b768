from metrale._sizing.target import *
from metrale._sizing.target import __all__ as __all__
