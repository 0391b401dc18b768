from metrale._integrations.weights import *
from metrale._integrations.weights import __all__ as __all__
