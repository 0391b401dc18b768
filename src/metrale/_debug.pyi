# No public names: BufferArena forwards to this module (see its docstring).
