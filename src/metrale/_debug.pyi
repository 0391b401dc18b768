# metrale._debug: BufferArena binds its debug operations from here (typed in _arena.pyi).
