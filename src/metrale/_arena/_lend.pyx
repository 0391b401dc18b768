# cython: language_level=3, binding=False
"""The lent buffer (src/lend.c): torch's allocator over one declared buffer,
handed out once as a MemPool's one segment, for metrale.torch's cuBLAS
workspace (install_workspaces).  Its two functions are C: torch calls them
under its allocator's mutex, from any thread, without the GIL."""

from libc.stdint cimport uint64_t

from metrale._base._common cimport u64_arg
from metrale._base._core cimport (mt_lend_alloc_fn, mt_lend_free_fn, mt_lend_out, mt_lend_refused,
                                  mt_lend_set)


def lend(ptr, nbytes):
    """Arm the lent buffer: torch's allocator pair `lender()` hands out
    `ptr` once, for a request of at most `nbytes` (0, 0: nothing to lend).

    Parameters
    ----------
    ptr, nbytes : int
    """
    cdef uint64_t p = u64_arg(ptr, "ptr"), n = u64_arg(nbytes, "nbytes")
    mt_lend_set(p, n)


def lender():
    """The lent buffer's allocator pair for torch: ``(alloc, free)``
    addresses of C functions (src/pool_slots.c), callable from any thread
    without the GIL.

    Returns
    -------
    tuple of (int, int)
    """
    return mt_lend_alloc_fn(), mt_lend_free_fn()


def lent():
    """(whether the buffer is handed out, the largest request refused)."""
    return bool(mt_lend_out()), mt_lend_refused()
