"""metrale.decode_meta is metrale._sizing.decode_meta, the same module (documented there)."""
import sys
from ._sizing import decode_meta
sys.modules[__name__] = decode_meta
