# Rows of integers that stand for what an object owns outside Python (mapped
# chunks, physical handles, host copies, descriptors): see _held.pyx.
from libc.stdint cimport uint64_t


cdef class Held:
    cdef uint64_t *_v             # _n rows of _width integers, C storage
    cdef Py_ssize_t _n, _cap
    cdef readonly Py_ssize_t width

    cdef int _room(self, Py_ssize_t n) except -1
    cdef int add(self, tuple row) except -1
    cdef Py_ssize_t find(self, tuple row) except -2
    cdef int assign(self, object rows) except -1
