from metrale._integrations.torch import *
from metrale._integrations.torch import __all__ as __all__
