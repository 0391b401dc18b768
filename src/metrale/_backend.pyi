from metrale.sizes import Target

class Backend:
    device_type: int
    device_id: int
    alloc_count: int
    live_alloc_count: int
    live_bytes: int
    free_count: int
    memset_count: int
    d2h_count: int
    h2d_count: int
    sync_count: int
    def target(self) -> Target: ...
    def clear_ranges(self, ranges: list[tuple[int, int]] | tuple[tuple[int, int], ...], stream: object = ...) -> None: ...

class HostBackend(Backend):
    def __init__(self) -> None: ...
