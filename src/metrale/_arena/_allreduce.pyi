# metrale._arena._allreduce: BufferArena binds peer_all_reduce and check_peer_reduce from here
# (typed in _buffer_arena.pyi).
