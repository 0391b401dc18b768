from metrale._backends.cuda import *
from metrale._backends.cuda import __all__ as __all__
