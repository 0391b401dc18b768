"""metrale.weights is metrale._integrations.weights, the same module (documented there)."""
import sys
from ._integrations import weights
sys.modules[__name__] = weights
