"""What is built on arenas: fit (fitting), the slab picture (picture) and
process checkpoints (checkpoint, over the driver's checkpoint calls).

docs/architecture.md maps the packages.
"""
