# metrale._sleep: BufferArena binds sleep and wake from here (typed in _arena.pyi).
