from metrale._integrations.checkpoint import *
from metrale._integrations.checkpoint import __all__ as __all__
