"""metrale.checkpoint is metrale._integrations.checkpoint, the same module (documented there)."""
import sys
from ._integrations import checkpoint
sys.modules[__name__] = checkpoint
