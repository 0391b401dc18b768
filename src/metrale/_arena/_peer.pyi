# metrale._arena._peer: BufferArena binds its peer methods from here (typed in _buffer_arena.pyi).
