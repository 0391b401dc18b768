"""Stubs of metrale._tp_exchange: its names are private (metrale.tp uses them)."""
