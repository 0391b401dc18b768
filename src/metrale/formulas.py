"""metrale.formulas is metrale._sizing.formulas, the same module (documented there)."""
import sys
from ._sizing import formulas
sys.modules[__name__] = formulas
