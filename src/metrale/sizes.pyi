from metrale._sizing.sizes import *
from metrale._sizing.sizes import __all__ as __all__
