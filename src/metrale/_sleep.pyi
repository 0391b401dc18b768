# metrale._sleep: no public names; BufferArena forwards sleep and wake here.
