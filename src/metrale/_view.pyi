from typing import Any, final

@final
class ArenaView:
    arena: Any
    name: str
    dtype: str
    shape: tuple[int, ...]
    ptr: int
    nbytes: int
    @property
    def __array_interface__(self) -> dict[str, Any]: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...
    def __dlpack__(self, *, stream: Any = ..., max_version: Any = ..., dl_device: Any = ..., copy: bool | None = ...) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
