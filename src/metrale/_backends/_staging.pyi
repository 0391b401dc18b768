"""Stubs of metrale._backends._staging: its names are private (metrale._arena._step uses them)."""
