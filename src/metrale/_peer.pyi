# metrale._peer: BufferArena binds its peer methods from here (typed in _arena.pyi).
