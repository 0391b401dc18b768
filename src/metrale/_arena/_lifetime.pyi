# metrale._arena._lifetime: BufferArena binds release, __enter__ and __exit__ from here (typed in _buffer_arena.pyi).
