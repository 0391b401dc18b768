# metrale._arena._reserve: BufferArena binds resize, trim and the reservation queries from here
# (typed in _buffer_arena.pyi).
