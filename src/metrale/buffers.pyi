from metrale._sizing.buffers import *
from metrale._sizing.buffers import __all__ as __all__
