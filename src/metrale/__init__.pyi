from metrale._arena import BufferArena as BufferArena
from metrale._step import StepInputs as StepInputs
from metrale._host_backend import HostBackend as HostBackend
from metrale._scratch import (ScratchSpace as ScratchSpace,
                              ScratchSpaceManager as ScratchSpaceManager,
                              ScratchStats as ScratchStats)
from metrale.config import ModelConfig as ModelConfig
from metrale.debug import DebugOptions as DebugOptions
from metrale.cuda import CudaBackend as CudaBackend
from metrale._summary import stats as stats
from metrale.fitting import ArenaFit as ArenaFit, fit as fit
from metrale.errors import (ConfigWarning as ConfigWarning, MetraleError as MetraleError,
                            OutOfMemoryError as OutOfMemoryError)
from metrale.moe import MoeFp8Scratch as MoeFp8Scratch
from metrale.sizes import (BufferSizes as BufferSizes, DecodeMetaLayout as DecodeMetaLayout,
                           Target as Target)
from metrale.buffers import BufferSet as BufferSet, BufferSpec as BufferSpec
from metrale.reference import REFERENCE as REFERENCE

__all__ = [
    'ModelConfig', 'BufferSizes', 'BufferSpec', 'BufferSet', 'REFERENCE', 'BufferArena', 'StepInputs', 'DecodeMetaLayout', 'MoeFp8Scratch',
    'Target',
    'HostBackend', 'CudaBackend', 'ScratchSpaceManager', 'ScratchSpace', 'ScratchStats',
    'MetraleError', 'OutOfMemoryError', 'ConfigWarning', 'GATEUP_FUSED_MAX_M',
    'DECODE_META_MIN_ROWS',
    'DECODE_META_MAX_ROWS', 'Q12_SIZING_STREAMS', 'VERIFY_ROW_CAP', 'DebugOptions', 'fit', 'ArenaFit',
    'stats',
]

GATEUP_FUSED_MAX_M: int
DECODE_META_MIN_ROWS: int
DECODE_META_MAX_ROWS: int
Q12_SIZING_STREAMS: int
VERIFY_ROW_CAP: int
__version__: str
