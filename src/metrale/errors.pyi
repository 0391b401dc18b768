from metrale._base.errors import *
