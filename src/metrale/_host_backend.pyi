from metrale._backend import Backend

class HostBackend(Backend):
    def __init__(self) -> None: ...
