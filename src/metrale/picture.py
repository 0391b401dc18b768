"""metrale.picture is metrale._integrations.picture, the same module (documented there)."""
import sys
from ._integrations import picture
sys.modules[__name__] = picture
