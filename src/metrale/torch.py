"""metrale.torch is metrale._integrations.torch, the same module (documented there)."""
import sys
from ._integrations import torch
sys.modules[__name__] = torch
