from metrale._backends._backend import Backend

class HostBackend(Backend):
    def __init__(self) -> None: ...
