# metrale._allreduce: no public names; peer_all_reduce is a method of BufferArena.
