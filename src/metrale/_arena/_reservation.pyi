from typing import final

from metrale._arena._offload import Owner

@final
class Reservation(Owner): ...

@final
class Part(Owner): ...
