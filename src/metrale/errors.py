"""metrale.errors is metrale._base.errors, the same module (documented there)."""
import sys
from ._base import errors
sys.modules[__name__] = errors
