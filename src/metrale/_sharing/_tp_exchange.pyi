"""Stubs of metrale._sharing._tp_exchange: its names are private (metrale._arena.tp uses them)."""
