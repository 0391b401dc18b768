from metrale._sizing.moe import *
from metrale._sizing.moe import __all__ as __all__
