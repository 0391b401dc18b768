from metrale._sizing.catalogue import *
from metrale._sizing.catalogue import __all__ as __all__
