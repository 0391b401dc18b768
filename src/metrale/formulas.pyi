from metrale._sizing.formulas import *
from metrale._sizing.formulas import __all__ as __all__
