# cython: language_level=3, binding=False
"""Held: the rows of integers by which an object owns memory, handles and
descriptors (an arena's mapped chunks ``(offset, bytes, handle)``, its
handles whose release failed ``(handle, bytes)``, its pinned host copies
...), kept where the cyclic collector cannot reach them.

An object freed by the cyclic collector is finalized after the collector
has cleared, in any order, every container reachable only from the garbage:
a Python list of chunks held by an arena may be empty by the time the
arena's ``__dealloc__`` would unmap them, and what they stood for leaks.  A
Held keeps its rows in C storage, holds no Python object and is not tracked
by the collector, so nothing clears it but its owner: whatever the order of
a collection, the owner's finalizer finds every row.
"""

cimport cython
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from libc.stdint cimport uint64_t


@cython.no_gc          # no Python object inside: it can be in no cycle
@cython.final
cdef class Held:
    """Held(width, rows=())
--

Rows of `width` unsigned 64-bit integers, out of the collector's reach.

    A list's protocol (append, remove, iteration ...) over C storage.

    Parameters
    ----------
    width : int
        Integers a row (1 to 8).
    rows : iterable of tuple, optional
        The first rows.

    Attributes
    ----------
    width : int
        Integers a row.
    """

    def __cinit__(self, Py_ssize_t width, rows=()):
        if not 1 <= width <= 8:
            raise ValueError(f"width must be 1 to 8, got {width}")
        self.width = width
        self.assign(rows)

    def __dealloc__(self):
        PyMem_Free(self._v)

    cdef int _room(self, Py_ssize_t n) except -1:
        """Storage for at least `n` rows (the rows held are kept)."""
        cdef Py_ssize_t cap
        cdef uint64_t *v
        if n > self._cap:
            cap = max(n, 2 * self._cap + 4)
            v = <uint64_t *>PyMem_Realloc(self._v, cap * self.width * sizeof(uint64_t))
            if v == NULL:
                raise MemoryError()
            self._v, self._cap = v, cap
        return 0

    cdef int add(self, tuple row) except -1:
        cdef Py_ssize_t j
        if len(row) != self.width:
            raise ValueError(f"a row of {self.width} integers, got {len(row)}")
        self._room(self._n + 1)
        for j in range(self.width):     # a bad item raises before the row is counted
            self._v[self._n * self.width + j] = row[j]
        self._n += 1
        return 0

    cdef Py_ssize_t find(self, tuple row) except -2:
        cdef Py_ssize_t i, j
        if len(row) != self.width:
            return -1
        for i in range(self._n):
            for j in range(self.width):
                if self._v[i * self.width + j] != row[j]:
                    break
            else:
                return i
        return -1

    cdef int assign(self, object rows) except -1:
        cdef uint64_t x
        # every row and integer checked and the storage made before the rows
        # held go: they stand for memory, and a failure must not forget them
        rows = [tuple(r) for r in rows]
        for r in rows:
            if len(r) != self.width:
                raise ValueError(f"a row of {self.width} integers, got {len(r)}")
            for v in r:
                x = v
        self._room(len(rows))
        self._n = 0
        for r in rows:
            self.add(r)
        return 0

    def _row(self, Py_ssize_t i):
        cdef Py_ssize_t j
        return tuple([self._v[i * self.width + j] for j in range(self.width)])

    def append(self, row):
        """Add `row` (a tuple of `width` integers) at the end.

        Parameters
        ----------
        row : tuple of int
            `width` integers, each in 0 .. 2**64 - 1.
        """
        self.add(tuple(row))

    def extend(self, rows):
        """Add each of `rows` at the end (all or none).

        Parameters
        ----------
        rows : iterable of tuple of int
            Rows as `append` takes them.
        """
        rows = [tuple(r) for r in rows]
        cdef Py_ssize_t n = self._n
        try:
            for r in rows:
                self.add(r)
        except BaseException:
            self._n = n
            raise

    def remove(self, row):
        """Remove the first row equal to `row`; ValueError if there is none.

        Parameters
        ----------
        row : tuple of int
            The row to remove.
        """
        cdef Py_ssize_t i = self.find(tuple(row)), k
        if i < 0:
            raise ValueError(f"{tuple(row)} is not held")
        for k in range(i * self.width, (self._n - 1) * self.width):
            self._v[k] = self._v[k + self.width]
        self._n -= 1

    def clear(self):
        """Remove every row."""
        self._n = 0

    def replace(self, rows):
        """Hold `rows` instead (all or none).

        Parameters
        ----------
        rows : iterable of tuple of int
            Rows as `append` takes them.
        """
        self.assign(rows)

    def sort(self):
        """Sort the rows (as tuples)."""
        self.assign(sorted(self))

    def __len__(self):
        return self._n

    def __getitem__(self, Py_ssize_t i):
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("row index out of range")
        return self._row(i)

    def __iter__(self):
        # a copy: the loop may change the rows (unmap_chunks removes them)
        return iter([self._row(i) for i in range(self._n)])

    def __contains__(self, row):
        return isinstance(row, tuple) and self.find(row) >= 0

    def __repr__(self):
        return f"Held({self.width}, {list(self)!r})"
