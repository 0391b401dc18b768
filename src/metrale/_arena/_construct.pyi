# metrale._arena._construct: no public names; BufferArena.new and from_sizes build arenas here.
