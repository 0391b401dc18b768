from metrale._integrations.fitting import *
from metrale._integrations.fitting import __all__ as __all__
