from metrale._sizing.config import *
from metrale._sizing.config import __all__ as __all__
