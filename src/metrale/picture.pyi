from metrale._integrations.picture import *
from metrale._integrations.picture import __all__ as __all__
