"""metrale.tp is metrale._arena.tp, the same module (documented there)."""
import sys
from ._arena import tp
sys.modules[__name__] = tp
