from collections.abc import Mapping

__all__ = ["hf_params", "SUPPORTED_MODEL_TYPES"]

SUPPORTED_MODEL_TYPES: tuple[str, ...]

def hf_params(config: Mapping[str, object]) -> dict[str, tuple[str, tuple[int, ...]]]: ...
