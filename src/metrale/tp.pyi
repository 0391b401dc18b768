from metrale._arena.tp import *
from metrale._arena.tp import __all__ as __all__
