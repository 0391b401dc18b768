from metrale._sizing.debug import *
from metrale._sizing.debug import __all__ as __all__
