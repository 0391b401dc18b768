# metrale._backends._mapping: no public names; the chunk teardown shared by reserved arenas and peer slabs.
