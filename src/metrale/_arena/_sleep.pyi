# metrale._arena._sleep: BufferArena binds sleep and wake from here (typed in _buffer_arena.pyi).
