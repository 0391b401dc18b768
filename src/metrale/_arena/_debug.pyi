# metrale._arena._debug: BufferArena binds its debug operations from here (typed in _buffer_arena.pyi).
