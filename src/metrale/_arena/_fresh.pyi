# metrale._arena._fresh: cdef functions only (what an arena's new memory starts with).
