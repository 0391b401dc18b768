# metrale._arena._checksum: BufferArena binds debug_buffer_checksum from here (typed in _buffer_arena.pyi).
