from metrale._arena._buffer_arena import BufferArena as BufferArena
from metrale._arena._step import StepInputs as StepInputs
from metrale._backends._host_backend import HostBackend as HostBackend
from metrale._backends._scratch import (ScratchSpace as ScratchSpace,
                                        ScratchSpaceManager as ScratchSpaceManager,
                                        ScratchStats as ScratchStats)
from metrale._sizing.config import ModelConfig as ModelConfig
from metrale._sizing.debug import DebugOptions as DebugOptions
from metrale._backends.cuda import CudaBackend as CudaBackend
from metrale._arena._summary import stats as stats
from metrale._integrations.fitting import ArenaFit as ArenaFit, fit as fit
from metrale._base.errors import (ConfigWarning as ConfigWarning, MetraleError as MetraleError,
                                  OutOfMemoryError as OutOfMemoryError)
from metrale._sizing.moe import MoeFp8Scratch as MoeFp8Scratch
from metrale._sizing.sizes import (BufferSizes as BufferSizes, DecodeMetaLayout as DecodeMetaLayout,
                                   Target as Target)
from metrale._sizing.buffers import BufferSet as BufferSet, BufferSpec as BufferSpec
from metrale._sizing.reference import REFERENCE as REFERENCE
from metrale._sizing.minimal import MINIMAL as MINIMAL
from metrale._sizing._layout import SlabPlan as SlabPlan, plan_layout as plan_layout

__all__ = [
    'ModelConfig', 'BufferSizes', 'BufferSpec', 'BufferSet', 'REFERENCE', 'MINIMAL', 'BufferArena', 'StepInputs', 'DecodeMetaLayout', 'MoeFp8Scratch',
    'Target',
    'HostBackend', 'CudaBackend', 'ScratchSpaceManager', 'ScratchSpace', 'ScratchStats',
    'MetraleError', 'OutOfMemoryError', 'ConfigWarning', 'GATEUP_FUSED_MAX_M',
    'DECODE_META_MIN_ROWS',
    'DECODE_META_MAX_ROWS', 'Q12_SIZING_STREAMS', 'VERIFY_ROW_CAP', 'DebugOptions', 'plan_layout',
    'SlabPlan', 'fit', 'ArenaFit', 'stats',
]

GATEUP_FUSED_MAX_M: int
DECODE_META_MIN_ROWS: int
DECODE_META_MAX_ROWS: int
Q12_SIZING_STREAMS: int
VERIFY_ROW_CAP: int
__version__: str
