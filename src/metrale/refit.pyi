from metrale._integrations.refit import *
from metrale._integrations.refit import __all__ as __all__
