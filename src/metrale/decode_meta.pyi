from metrale._sizing.decode_meta import *
from metrale._sizing.decode_meta import __all__ as __all__
