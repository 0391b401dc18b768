# cython: language_level=3, binding=False
"""Guards (docs/stable-addresses.md): what a pass over an arena's memory
checks before it runs.  A guard covers some classes of the arena (the
buffers' tags, and the pool's class ``"torch"``); ``check()`` refuses, with
MetraleError naming each one, while one of them sleeps: one test of the
arena's 64-bit mask of sleeping classes, no Python object made.  Each wake
of a class counts in its epoch, so an engine can tell memory computed before
the current weights from memory computed after.  BufferArena binds `guard`
from here.
"""

cimport cython
from libc.stdint cimport uint64_t

from metrale._arena._arena_state cimport ArenaState
from metrale._arena._sleep_state cimport TORCH_CLASS, SleepState
from metrale._base._life cimport mt_life_released

from metrale._base.errors import MetraleError
from metrale._sizing._spec import POOL_NAME as _POOL_NAME

cdef object _TOKEN = object()


@cython.binding(True)
def guard(ArenaState self, *names):
    """A guard over the classes a pass touches.

    Parameters
    ----------
    *names : str
        Classes (``BufferSpec(tag=...)``; ``"torch"``: the pool's), or
        buffer names (their classes).  None: every class of the arena (and
        the pool's, where it has one).

    Returns
    -------
    Guard

    Raises
    ------
    TypeError
        A name is not a str.
    ValueError
        A name is neither a class nor a buffer of the arena (or
        ``"torch"`` for an arena with no pool).
    MetraleError
        The arena has no reservation (it cannot sleep: nothing to guard).
    """
    cdef ArenaState a = self
    cdef Guard g
    cdef uint64_t mask = 0
    classes = a._buffers.classes
    order = list(classes)
    if a._reservation is None:
        raise MetraleError("guard: the arena has no reservation: it never sleeps "
                           "(docs/stable-addresses.md)")
    for k, n in enumerate(names):
        if type(n) is not str:
            raise TypeError(f"guard: names[{k}] must be a str, got {type(n).__name__}")
    if not names:
        names = tuple(order) + ((_POOL_NAME,) if a._pool is not None else ())
    for n in names:
        if n == _POOL_NAME:
            if a._pool is None:
                raise ValueError(f"guard: {_POOL_NAME!r} is the arena's pool, and it has none "
                                 "(open_pool)")
            mask |= <uint64_t>1 << TORCH_CLASS
        elif n in classes:
            mask |= <uint64_t>1 << order.index(n)
        elif n in a._index:
            mask |= <uint64_t>1 << order.index(a._buffers[n].tag)
        else:
            raise ValueError(f"guard: {n!r} is not a class ({', '.join(order)}); "
                             f"{a._buffers._unknown(n)}")
    g = Guard.__new__(Guard, _TOKEN)
    g.arena, g.state, g.mask = a, a._sleep_state, mask
    g.names = tuple(order) + ("",) * (TORCH_CLASS - len(order)) + (_POOL_NAME,)
    return g


# no_gc: it holds the arena (which holds no guard) and plain values.
@cython.no_gc
@cython.final
cdef class Guard:
    """Guard()
--

What a pass over some classes of an arena checks first (made by
    ``BufferArena.guard``).
    """

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("Guard is made by BufferArena.guard")

    def check(self):
        """Refuse a pass while a class it covers sleeps.

        Raises
        ------
        MetraleError
            A class it covers sleeps (each named), or the arena is
            released.
        """
        if self.state.asleep & self.mask or mt_life_released(self.arena._life):
            raise MetraleError(self._refusal())

    cdef str _refusal(self):
        if mt_life_released(self.arena._life):
            return "guard: the buffer arena is released"
        asleep = self._classes(self.state.asleep & self.mask)
        return (f"guard: the pass touches {', '.join(asleep)}, asleep: wake "
                f"{'it' if len(asleep) == 1 else 'them'} first")

    cdef list _classes(self, uint64_t bits):
        return [self.names[k] for k in range(64) if bits >> k & 1]

    @property
    def classes(self):
        """The classes it covers (tuple of str), in the arena's order."""
        return tuple(self._classes(self.mask))

    @property
    def asleep(self):
        """The classes it covers that sleep now (tuple of str)."""
        return tuple(self._classes(self.state.asleep & self.mask))

    @property
    def epochs(self):
        """Each class it covers -> its wakes so far (dict of str to int): a
        value that changed since a pass means the class woke again since
        (its memory was given back and mapped anew, or refilled)."""
        return {self.names[k]: self.state.epoch[k] for k in range(64) if self.mask >> k & 1}

    def wrap(self, fn):
        """`fn` behind this guard: a callable that checks first.

        Parameters
        ----------
        fn : callable
            What a pass launches (a CUDA graph's bound ``replay``, a kernel
            launch); called with the arguments the wrapper is given.

        Returns
        -------
        Guarded
            Calling it raises as `check` does, calling nothing, while a class
            the guard covers sleeps; else it returns ``fn(*args)``.  The
            check is made in C before the call: no Python frame of its own.

        Raises
        ------
        TypeError
            `fn` is not callable.
        """
        if not callable(fn):
            raise TypeError(f"wrap: fn must be callable, got {type(fn).__name__}")
        cdef Guarded w = Guarded.__new__(Guarded, _TOKEN)
        w.guard, w.fn = self, fn
        return w

    def __repr__(self):
        return f"Guard({', '.join(self.classes)})"


@cython.final
cdef class Guarded:
    """Guarded()
--

A callable behind a guard (made by ``Guard.wrap``).
    """
    cdef Guard guard
    cdef object fn

    def __cinit__(self, token=None):
        if token is not _TOKEN:
            raise TypeError("Guarded is made by Guard.wrap")

    def __call__(self, *args):
        cdef Guard g = self.guard
        if g.state.asleep & g.mask or mt_life_released(g.arena._life):
            raise MetraleError(g._refusal())
        return self.fn(*args)

    @property
    def guard(self):
        """The `Guard` it checks."""
        return self.guard

    def __repr__(self):
        return f"Guarded({self.fn!r}, {self.guard!r})"
