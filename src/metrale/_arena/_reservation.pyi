from typing import final

@final
class Reservation: ...
