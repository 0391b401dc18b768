from metrale._arena import BufferArena as BufferArena, MoeFp8Scratch as MoeFp8Scratch
from metrale._backend import HostBackend as HostBackend
from metrale._scratch import (ScratchSpace as ScratchSpace,
                              ScratchSpaceManager as ScratchSpaceManager,
                              ScratchStats as ScratchStats)
from metrale.config import ModelConfig as ModelConfig
from metrale.cuda import CudaBackend as CudaBackend
from metrale.errors import MetraleError as MetraleError, OutOfMemoryError as OutOfMemoryError
from metrale.sizes import (BufferSizes as BufferSizes, DecodeMetaLayout as DecodeMetaLayout,
                           Target as Target)

GATEUP_FUSED_MAX_M: int
DECODE_META_MIN_ROWS: int
DECODE_META_MAX_ROWS: int
Q12_SIZING_STREAMS: int
VERIFY_ROW_CAP: int
__version__: str
