# metrale._reserve: BufferArena binds resize and the reservation queries from here
# (typed in _arena.pyi).
