from typing import Any, Sequence

USAGE: int
RUNTIME: int

def plan(args: Any) -> dict[str, Any]: ...
def main(argv: Sequence[str] | None = ...) -> int: ...
