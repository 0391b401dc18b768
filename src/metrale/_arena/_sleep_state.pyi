from typing import final

@final
class SleepState: ...
