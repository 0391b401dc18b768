# metrale._base._life: no public names; the lifetime word of arenas and step inputs (see _life.pxd).
