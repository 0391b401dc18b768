# cython: language_level=3, binding=False
"""An arena's release, and the arena as a context manager (docs/lifetime.md).
The waiting and the freeing are ArenaState's (`_release`, `free_memory`);
BufferArena binds `release`, `__enter__` and `__exit__` from here.
"""

cimport cython

from metrale._arena._arena_state cimport ArenaState


@cython.binding(True)
def release(ArenaState self, gpu=None):
    """Free the memory; afterwards every pointer accessor returns 0.

    Idempotent.  Operations and a resize, sleep or wake running on other
    threads are waited for (without the GIL; Ctrl-C interrupts the wait,
    leaving the arena as it was); any started later raise MetraleError.
    A release refused for live views stops new views, so the next one
    succeeds once they are gone; one that failed to free part way tries
    again when called again.  The rules, fork included: docs/lifetime.md.

    Parameters
    ----------
    gpu : Backend, optional
        The arena's own backend (the reference passes it); None: that one.

    Raises
    ------
    BufferError
        A view, or an array made from one, is alive; nothing was freed.
    MetraleError
        `gpu` is another backend; called from inside an operation on the
        arena, or from its resize, sleep or wake on this thread; or the
        backend failed to free (the driver's error name).
    KeyboardInterrupt
        The wait was interrupted; nothing was freed.
    """
    self._release(gpu)


@cython.binding(True)
def enter(ArenaState self):
    """Use the arena as a context manager: released at the end of the block."""
    return self


@cython.binding(True)
def exit(ArenaState self, exc_type, exc, tb):
    """Release the arena (see `release`); exceptions propagate.

    Parameters
    ----------
    exc_type, exc, tb
        The block's exception, if any (not swallowed).
    """
    self._release(self._gpu)
    return None
