# metrale._debug: no public names; BufferArena forwards its debug operations here.
