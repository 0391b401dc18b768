from metrale._sizing.levers import *
from metrale._sizing.levers import __all__ as __all__
