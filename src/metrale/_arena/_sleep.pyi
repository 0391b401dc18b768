# metrale._arena._sleep: BufferArena binds sleep, wake and prepare_sleep from here (typed in _buffer_arena.pyi).
