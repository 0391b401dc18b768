from typing import Any, Final, Protocol, SupportsIndex, Union

__all__ = [
    'check_index', 'seconds_arg', 'stream_handle', 'MAX_SECONDS', 'resolve_dtype', 'DTYPE_NAMES', 'U64_MAX',
]

class _CudaStreamProtocol(Protocol):
    # cuda.core's Stream and anything else of the CUDA stream protocol.
    def __cuda_stream__(self) -> tuple[int, int]: ...

class _TorchStream(Protocol):
    @property
    def cuda_stream(self) -> int: ...

class _CupyStream(Protocol):
    @property
    def ptr(self) -> int: ...

# What a `stream` argument takes: an int handle (0 = the legacy default
# stream), None (the default stream), or a stream object of cuda.core, torch
# or CuPy.
StreamLike = Union[SupportsIndex, _CudaStreamProtocol, _TorchStream, _CupyStream, None]
# What a `dtype` argument takes: a numpy spelling or dtype, a scalar type, a
# torch dtype, or 'bfloat16' / 'float8_e4m3fn' / 'float8_e5m2'.
DTypeLike = Union[str, type, Any]

U64_MAX: Final[int]
MAX_SECONDS: Final[float]
DTYPE_NAMES: tuple[str, ...]

def check_index(value: SupportsIndex, name: str, minimum: int = ..., maximum: int = ...) -> int: ...
def seconds_arg(value: float, name: str) -> float: ...
def stream_handle(stream: StreamLike) -> int: ...
def resolve_dtype(dtype: DTypeLike) -> str: ...
