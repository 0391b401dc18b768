# metrale._arena._carve: BufferArena binds take_ssm_rowwise_w_bf16 from here (typed in _buffer_arena.pyi).
