# metrale._reserve: no public names; BufferArena forwards resize and the reservation queries here.
