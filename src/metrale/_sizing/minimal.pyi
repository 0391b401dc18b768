from metrale._sizing.buffers import BufferSet

__all__ = ["MINIMAL", "TOML_PATH"]

MINIMAL: BufferSet
TOML_PATH: str
