"""Stubs of metrale._staging: its names are private (metrale._step uses them)."""
