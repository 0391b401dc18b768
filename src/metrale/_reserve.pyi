# metrale._reserve: no public names; BufferArena forwards resize, sleep and wake here.
