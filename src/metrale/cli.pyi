from metrale._cli.cli import *
