from metrale._backends.testing import *
from metrale._backends.testing import __all__ as __all__
