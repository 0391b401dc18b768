# metrale._arena._reserve: BufferArena binds resize and the reservation queries from here
# (typed in _buffer_arena.pyi).
