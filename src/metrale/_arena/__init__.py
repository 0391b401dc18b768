"""The arena layer: BufferArena (_buffer_arena) and its state (_arena_state),
one module per concept with its own state and methods: the reservation,
sleep, peers and their all-reduce, debug guards, step inputs, views, the
summary, and the construction that ties them.

docs/architecture.md maps the packages.
"""
