"""metrale.cli is metrale._cli.cli, the same module (documented there)."""
import sys
from ._cli import cli
sys.modules[__name__] = cli
