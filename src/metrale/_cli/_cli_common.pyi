USAGE: int
RUNTIME: int
