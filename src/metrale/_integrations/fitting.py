"""Planning: how large an arena fits in a memory budget, and what it leaves.

`fit` answers the inverse of `BufferSizes.from_config`: given a budget in
bytes, the largest ``max_batch_tokens`` whose arena fits, found from the
sizing formulas and the slab layout (nothing is allocated); or, for a given
``max_batch_tokens``, how many tokens of KV cache fit in what the arena
leaves.  `parse_size` (metrale._base._size_arg) reads the byte counts it
takes ("12GiB", "80 GB").

Pure Python over the sizing formulas and `metrale._sizing._layout`; loaded on first
use of ``metrale.fit``.
"""

from ._growth import growth, growth_span
from .._base._common import check_index
from .._base._size_arg import SIZE_UNITS, parse_size
from .._sizing._layout import plan_layout, plan_reserved
from .._base._math import U64_MAX
from .._base._record import Record
from .._sizing.reference import REFERENCE
from .._sizing.buffers import BufferSet
from .._sizing.debug import DebugOptions
from .._sizing.formulas import evaluate, first_shrinking, values
from .._sizing.sizes import BufferSizes, sizing_inputs

__all__ = ["fit", "ArenaFit", "parse_size", "growth", "growth_span", "FREE_MEMORY_MARGIN",
           "SIZE_UNITS"]

# What fit(budget=None) keeps back from the device's free memory: 2 MiB, the
# allocation granularity of H100/H200 (the driver backs a large cuMemAlloc with
# 2 MiB pages, so the one slab may cost up to that much more than its bytes;
# to be measured on the H200 with cuMemGetInfo), plus 62 MiB for
# what the CUDA context creates on first use after the free memory was read
# (lazily loaded kernel modules, metrale's own among them; the 1 MiB printf
# FIFO and 8 MiB malloc heap of kernels that use them).  A choice, not a
# measurement: see docs/fit.md.
FREE_MEMORY_MARGIN = 64 * 2**20

_ALIGN = 256            # the slab's placement alignment (MT_ALIGN, src/arena_core.h)


class ArenaFit(Record):
    """What `fit` found: an arena's bytes in a budget, and what is left.

    ``arena_bytes + pool_bytes + kv_bytes + headroom_bytes == budget``
    always (the KV terms are 0 without `kv_bytes_per_token`, `pool_bytes`
    without `torch_pool_bytes`).  ``str(result)`` is the
    one-screen answer `metrale fit` prints.

    Attributes
    ----------
    max_batch_tokens : int
        The arena's max_batch_tokens: the largest that fits (or the one
        given to `fit`).
    arena_bytes : int
        Device memory the arena takes at `max_batch_tokens`: its one slab
        (256-byte placement padding, guard bands included), or for a
        reserved arena the physical memory it maps (its sub-ranges rounded
        up to `granularity`).
    budget : int
        The budget in bytes.
    left_bytes : int
        ``budget - pool_bytes - arena_bytes``.
    limited_by : str
        ``"budget"``: the arena at ``max_batch_tokens + 1`` takes
        `next_arena_bytes`, more than the budget; ``"formulas"``: at
        ``max_batch_tokens + 1`` a size, their sum or the slab would exceed
        2**64 - 1 bytes, the most the formulas allow; ``"given"``:
        `max_batch_tokens` was given, not searched.
    next_arena_bytes : int or None
        The arena's bytes at ``max_batch_tokens + 1`` when `limited_by` is
        ``"budget"``; None otherwise.
    kv_bytes_per_token : int or None
        KV-cache bytes per token, as given (None: not asked).
    kv_tokens : int
        Tokens of KV cache that fit in `left_bytes`:
        ``left_bytes // kv_bytes_per_token`` (0 when not asked).
    kv_bytes : int
        ``kv_tokens * kv_bytes_per_token``.
    headroom_bytes : int
        What is left after the arena and the KV cache.
    max_seq_len, kv_block_size, max_batch_size, tp_size : int
        The other limits the arena is sized for.
    reserved : bool
        Whether the arena was sized as a reserved arena (``reserve=True``).
    granularity : int or None
        The allocation granularity of a reserved arena; None otherwise.
    guard_bytes : int
        A debug arena's guard bytes after every live buffer; 0 otherwise.
    margin_bytes : int
        For ``budget=None``: what was kept back from the device's free
        memory (the budget is the free memory minus this); 0 otherwise.
    evaluations : int
        Sizing evaluations (the sizes and the layout at one
        max_batch_tokens) the answer took.
    pool_bytes : int
        The arena's pool (``BufferArena.open_pool``, torch's memory in
        the arena: docs/torch.md) as `torch_pool_bytes` asked for it,
        rounded up to `granularity`: all of it mapped, the most it takes;
        0 without.
    """

    __slots__ = ("max_batch_tokens", "arena_bytes", "budget", "left_bytes", "limited_by",
                 "next_arena_bytes", "kv_bytes_per_token", "kv_tokens", "kv_bytes",
                 "headroom_bytes", "max_seq_len", "kv_block_size", "max_batch_size", "tp_size",
                 "reserved", "granularity", "guard_bytes", "margin_bytes", "evaluations",
                 "pool_bytes")
    _defaults = {"pool_bytes": 0}

    def __str__(self):
        def size(n):
            return f"{n:,} bytes ({n / 2**30:,.2f} GiB)"

        def share(n):
            return f"{100 * n / self.budget:5.1f} %"

        kind = (f"reserved, granularity {self.granularity:,}" if self.reserved else "one slab")
        if self.guard_bytes:
            kind += f", debug guard bands of {self.guard_bytes:,} bytes"
        if self.limited_by == "budget":
            why = (f"at {self.max_batch_tokens + 1:,} the arena takes "
                   f"{self.next_arena_bytes:,} bytes, over the budget")
        elif self.limited_by == "formulas":
            why = ("the most the sizing formulas allow: at one more the arena would exceed "
                   "2^64 - 1 bytes")
        else:
            why = "as given"
        lines = [
            f"max_batch_tokens: {self.max_batch_tokens:,} ({why})",
            f"  limits: max_seq_len={self.max_seq_len} kv_block_size={self.kv_block_size} "
            f"max_batch_size={self.max_batch_size}"
            + (f" tp_size={self.tp_size} (per rank)" if self.tp_size != 1 else ""),
            f"budget:   {size(self.budget)}"
            + (f", the free memory less a margin of {self.margin_bytes:,} bytes"
               if self.margin_bytes else ""),
            f"arena:    {size(self.arena_bytes)} {share(self.arena_bytes)}  ({kind})",
        ]
        if self.pool_bytes:
            lines.append(f"pool:     {size(self.pool_bytes)} {share(self.pool_bytes)}  "
                         "(torch's memory in the arena, all of it mapped)")
        if self.kv_bytes_per_token is not None:
            lines.append(f"KV cache: {size(self.kv_bytes)} {share(self.kv_bytes)}  "
                         f"({self.kv_tokens:,} tokens x {self.kv_bytes_per_token:,} bytes)")
        lines.append(f"headroom: {size(self.headroom_bytes)} {share(self.headroom_bytes)}")
        return "\n".join(lines)


def _arena_bytes(sizes, m, guard, gran):
    """The device bytes of the arena of `sizes` at max_batch_tokens `m`: the
    slab of the arena's own planner (layout.c), or for a reserved arena
    (reserved at its own limits) what it maps."""
    if gran is not None:
        nbytes = plan_reserved(sizes, sizes, m, gran, guard_bytes=guard).committed_bytes
    else:
        nbytes = plan_layout(sizes, guard_bytes=guard).slab_bytes
    if nbytes > U64_MAX:
        raise ValueError(f"the arena at max_batch_tokens={m} exceeds 2^64 - 1 bytes")
    return nbytes


class _Sizer:
    """The arena's bytes at one max_batch_tokens, counting the evaluations."""

    def __init__(self, config, limits, target, env, tp_size, guard, gran, buffers):
        self.config, self.limits, self.target, self.env = config, limits, target, env
        self.tp_size, self.guard, self.gran, self.buffers = tp_size, guard, gran, buffers
        self.evaluations = 0

    def sizes(self, m):
        return BufferSizes.from_config(self.config, m, *self.limits, target=self.target,
                                       env=self.env, tp_size=self.tp_size, buffers=self.buffers)

    def __call__(self, m):
        self.evaluations += 1
        return _arena_bytes(self.sizes(m), m, self.guard, self.gran)

    def symbols(self, m):
        """The value of every symbol of the formulas at `m` (checked inputs)."""
        m, *rest = sizing_inputs(self.config, m, *self.limits, self.target, self.env)
        return values(self.config.shard(self.tp_size), m, *rest, tp_size=self.tp_size)

    def beyond(self, m):
        """The arena's bytes at `m` > 1, or None where the formulas stop
        (a size, the sum or the slab over 2**64 - 1).  A size that cannot
        be computed at `m` (a formula of the set that divides by zero or
        goes negative there) raises its ValueError: no arena exists at `m`,
        so none can be said to fit or not."""
        try:
            return self(m)
        except ValueError:
            if self._computable(m):
                return None         # every size is a size: too large, then
            raise

    def _computable(self, m):
        symbols = self.symbols(m)
        for s in self.buffers:
            try:
                v = evaluate(s.formula, symbols)
            except ArithmeticError:
                return False
            if type(v) is not int or v < 0:
                return False
        return True


def _line(m0, s0, m1, s1, budget):
    """The largest m the line through (m0, s0) and (m1, s1), m0 < m1 and
    s0 < s1, puts at or under `budget` (exact integer arithmetic)."""
    return m0 + (budget - s0) * (m1 - m0) // (s1 - s0)


def _largest_fitting(arena, first, budget):
    """The largest m with arena(m) <= budget, given arena(1) = `first` fits.

    arena(m) never decreases as m grows: every size formula is
    non-decreasing in max_batch_tokens (`first_shrinking` proves it first), and
    the layout places the buffers in a fixed order, each at the running end
    rounded up to its alignment, ending on 256 bytes or a granule
    (tests/test_fit.py checks both).  So the m that fit are 1 ... M: a bracket lo (fits) <
    hi (does not) holds M, and a probe at any m moves one end of it.

    The arena grows about linearly with m, but in steps (GEMM tiles of 16
    rows, granules of a reserved arena), so a line predicts M closely but
    not exactly.  First a hi is found: probes at the m the line through the
    last two fitting points predicts not to fit, every other probe a
    doubling of lo.  Then, until hi = lo + 1: one probe where the line
    through lo and hi predicts M, and a gallop from there (steps 1, 2, 4,
    ... towards the side not yet bounded), which bounds M within twice the
    prediction's error for the next, closer line.  Returns (M, arena(M),
    arena(M + 1), the last None when M + 1 is past what the formulas
    allow)."""
    lo, s_lo = 1, first
    prev, s_prev = None, None           # the fitting point before lo
    hi, s_hi = None, None

    def probe(m):
        nonlocal lo, s_lo, prev, s_prev, hi, s_hi
        s = arena.beyond(m)
        if s is not None and s <= budget:
            prev, s_prev, lo, s_lo = lo, s_lo, m, s
            return True
        hi, s_hi = m, s
        return False

    step = 0
    while hi is None:                   # find a point that does not fit
        guess = 2 * lo
        if step % 2 == 0 and prev is not None and s_lo > s_prev:
            guess = _line(prev, s_prev, lo, s_lo, budget) + 1
        c = min(max(guess, lo + 1), U64_MAX)
        if c <= lo:                     # lo == 2**64 - 1: nothing above it
            return lo, s_lo, None
        probe(c)
        step += 1
    while hi - lo > 1:
        # A probe where a line says M is, then a gallop away from it.  A
        # hi past the formulas (s_hi None) has no value to draw a line to:
        # then the line through the last two fitting points, in turn with
        # a halving.
        guess = None
        if s_hi is not None:
            guess = _line(lo, s_lo, hi, s_hi, budget)
        elif step % 2 == 0 and prev is not None and s_lo > s_prev:
            guess = _line(prev, s_prev, lo, s_lo, budget)
        step += 1
        if guess is None:
            probe((lo + hi) // 2)
            continue
        fits = probe(min(max(guess, lo + 1), hi - 1))
        if not fits and s_hi is None:
            continue                    # no gallop down from past the formulas
        span = 1
        while hi - lo > 2 * span and probe(lo + span if fits else hi - span) == fits:
            span *= 2
    return lo, s_lo, s_hi


def _free_budget(gpu, margin):
    mem_info = getattr(gpu, "mem_info", None)
    if gpu is None or not callable(mem_info):
        raise TypeError("budget=None means the free memory of gpu=: pass a CudaBackend (a "
                        "backend with mem_info()), or give the budget in bytes"
                        + (f"; {type(gpu).__name__} reports none" if gpu is not None else ""))
    free, _total = mem_info()
    if free <= margin:
        raise ValueError(f"budget: the device has {free:,} bytes free, not more than the margin "
                         f"of {margin:,} bytes fit keeps back")
    return free - margin


def fit(config, budget, max_seq_len, kv_block_size, max_batch_size, *, tp_size=1,
        buffers=None, reserve=False, debug=None, granularity=None, max_batch_tokens=None,
        kv_bytes_per_token=None, env=None, target=None, gpu=None, margin=None,
        torch_pool_bytes=None):
    """The largest max_batch_tokens whose arena fits in a budget, or the KV
    cache that fits beside a given one.

    The arena is the one ``BufferArena.new(config, M, max_seq_len,
    kv_block_size, max_batch_size, gpu, tp_size=tp_size, env=env,
    debug=debug, buffers=buffers)`` builds (with ``reserve=(M, max_seq_len,
    kv_block_size, max_batch_size)`` for ``reserve=True``): its bytes come
    from the sizing formulas and the arena's layout (each buffer at a
    multiple of its spec's alignment), nothing is allocated.  The answer is
    exact: the arena at the returned M fits in `budget` and the arena at
    M + 1 does not (``limited_by="budget"``), or M + 1 is past what the
    formulas allow (``limited_by="formulas"``); and no larger M fits, since
    every size is first proved not to shrink as M grows (see `buffers`).  It costs about ten sizing
    evaluations, at most a few dozen (`ArenaFit.evaluations`): well under a
    millisecond (bench/RESULTS.md).

    With `max_batch_tokens` given, nothing is searched: the arena at that M
    must fit, and the answer says what it leaves.  With
    `kv_bytes_per_token`, it also says how many tokens of KV cache fit in
    what the arena leaves.  With `torch_pool_bytes`, the arena's pool
    (torch's memory in the arena, docs/torch.md) is set aside first.

    Parameters
    ----------
    config : ModelConfig
        The model's shape.
    budget : int, str or None
        Device bytes the arena (and the KV cache) may take: an int, or a
        size string such as ``"12GiB"`` or ``"80 GB"`` (the grammar of
        `parse_size`).  None: the free memory of `gpu` (``gpu.mem_info()``)
        less `margin`.
    max_seq_len, kv_block_size, max_batch_size : int
        The other serving limits, as `BufferArena.new` takes them.
    tp_size : int, optional
        Size one rank of a tensor-parallel group of this many ranks (the
        budget is then one GPU's, and `kv_bytes_per_token` one rank's).
    buffers : BufferSet, optional
        The buffers the arena holds (docs/buffer-sets.md); None means
        `REFERENCE`.  To search, every size of the set must be seen not to
        shrink as max_batch_tokens grows, for this model and these limits:
        a formula that reads M only through ``+ - * //``, ``max``, ``min``,
        ``cdiv``, ``ceilN`` and conditions on the other symbols is; one that
        reads M in a condition or through ``%`` (or shrinks with it) is
        refused, unless `max_batch_tokens` is given.
    reserve : bool, optional
        Size a reserved arena (stable addresses) reserved at the limits it
        has: each buffer's sub-range rounded up to `granularity`, all of it
        mapped.  Default False: one plain allocation.
    debug : bool or DebugOptions, optional
        Size a debug arena: a guard band after every live buffer, as
        ``BufferArena.new(..., debug=debug)`` places them.
    granularity : int or str, optional
        The allocation granularity of a reserved arena, in bytes (a power
        of two >= 256): 2 MiB for CUDA on H100 and H200, the page size for
        the host backend.  With ``reserve=True``, None takes
        ``gpu.allocation_granularity()`` (required without `gpu`); refused
        without `reserve`.
    max_batch_tokens : int, optional
        Do not search: size the arena at this M (>= 1).
    kv_bytes_per_token : int, optional
        KV-cache bytes one token takes (on one rank), e.g. ``2 *
        num_key_value_heads * head_dim * 2 * full_attention_layers`` for a
        BF16 cache (docs/fit.md); >= 1.
    env : mapping, optional
        Where the environment levers are read, as `BufferSizes.from_config`
        takes it; None means ``os.environ``.
    target : Target, optional
        The device the sizes are for; None means ``gpu.target()`` when
        `gpu` is given, else `Target.reference`.  Not with `gpu`.
    gpu : Backend, optional
        The backend the arena will be built on: its ``target()`` sizes the
        arena, and with ``budget=None`` its ``mem_info()`` gives the free
        memory (a CudaBackend).
    margin : int or str, optional
        With ``budget=None``, the bytes kept back from the free memory;
        default `FREE_MEMORY_MARGIN` (64 MiB: the 2 MiB allocation
        granularity plus an allowance for what the CUDA context creates on
        first use).  Refused with a budget given.
    torch_pool_bytes : int or str, optional
        The pool the arena will open (``arena.open_pool(n)``,
        ``metrale.torch.pool(arena, n)``), set aside from the budget
        before the arena is sized: rounded up to `granularity`, as
        ``open_pool`` rounds it, and counted whole (the most it maps).
        Needs ``reserve=True``.

    Returns
    -------
    ArenaFit
        The M, the arena's bytes at M and at M + 1, what is left, and with
        `kv_bytes_per_token` the KV tokens and bytes that fit.

    Raises
    ------
    TypeError
        An argument of the wrong type (named in the message): `budget` not
        an int, a size string or None, `buffers` not a BufferSet, ``budget=None``
        without a `gpu` that has ``mem_info()``, and every type error of
        `BufferSizes.from_config`.
    ValueError
        An argument out of range (named): a budget that is not a positive
        size; a budget smaller than the smallest arena (max_batch_tokens =
        1; its size is in the message), or than the arena at a given
        `max_batch_tokens`; `kv_bytes_per_token` of 0; `granularity`
        missing with ``reserve=True``, given without it, or not a power of
        two >= 256; `target` with `gpu`; `margin` with a budget;
        `torch_pool_bytes` not a positive size, without ``reserve=True``,
        or not less than the budget; a size of
        `buffers` not seen to grow with max_batch_tokens (named), or one
        that cannot be computed at an M the search probes; and every value
        error of `BufferSizes.from_config` at max_batch_tokens = 1.
    """
    if buffers is None:
        buffers = REFERENCE
    elif not isinstance(buffers, BufferSet):
        raise TypeError(f"buffers must be a BufferSet or None, got {type(buffers).__name__}")
    if not isinstance(reserve, bool):
        raise TypeError(f"reserve must be a bool, got {type(reserve).__name__}")
    opts = DebugOptions.coerce(debug)
    guard = opts.guard_bytes if opts is not None else 0
    gran = None
    if reserve:
        if granularity is None and gpu is not None and hasattr(gpu, "allocation_granularity"):
            granularity = gpu.allocation_granularity()
        if granularity is None:
            raise ValueError("granularity: reserve=True needs the allocation granularity in "
                             "bytes (2 MiB for CUDA on H100/H200, the page size on the host), "
                             "or gpu=")
        gran = parse_size(granularity, "granularity")
        if gran < _ALIGN or gran & (gran - 1):
            raise ValueError(f"granularity must be a power of two >= {_ALIGN}, got {gran}")
    elif granularity is not None:
        raise ValueError("granularity applies to reserved arenas: pass reserve=True, or leave "
                         "granularity out")
    if gpu is not None:
        from .._backends._backend import Backend
        if not isinstance(gpu, Backend):
            raise TypeError(f"gpu must be a backend (HostBackend or CudaBackend), got "
                            f"{type(gpu).__name__}")
        if target is not None:
            raise ValueError("target: pass gpu= or target=, not both (gpu.target() sizes the "
                             "arena BufferArena.new builds on it)")
        target = gpu.target()
    if budget is None:
        margin = FREE_MEMORY_MARGIN if margin is None else parse_size(margin, "margin")
        budget = _free_budget(gpu, margin)
    else:
        if margin is not None:
            raise ValueError("margin applies to budget=None (the free memory of gpu=)")
        margin = 0
        budget = parse_size(budget, "budget")
    pool = 0
    if torch_pool_bytes is not None:
        if not reserve:
            raise ValueError("torch_pool_bytes: the pool lives in a reserved arena's address "
                             "space: pass reserve=True")
        pool = -(-parse_size(torch_pool_bytes, "torch_pool_bytes") // gran) * gran
        if pool >= budget:
            raise ValueError(f"torch_pool_bytes: the pool's {pool:,} bytes (rounded up to the "
                             f"granularity) leave nothing of the budget of {budget:,} bytes")
    # What the arena (and the KV cache) may take: the budget less the pool.
    room = budget - pool
    less = f" less the pool's {pool:,}" if pool else ""
    kv = None if kv_bytes_per_token is None else check_index(kv_bytes_per_token,
                                                              "kv_bytes_per_token", 1)
    tp = check_index(tp_size, "tp_size", 1)
    limits = (max_seq_len, kv_block_size, max_batch_size)
    arena = _Sizer(config, limits, target, env, tp, guard, gran, buffers)
    if max_batch_tokens is not None:
        m = check_index(max_batch_tokens, "max_batch_tokens", 1)
        nbytes = arena(m)
        if nbytes > room:
            raise ValueError(f"max_batch_tokens: the arena at max_batch_tokens={m} takes "
                             f"{nbytes:,} bytes, more than the budget of {budget:,} bytes"
                             + less)
        limited_by, following = "given", None
    else:
        first = arena(1)
        if first > room:
            raise ValueError(f"budget: {budget:,} bytes{less} is less than the smallest arena "
                             f"(max_batch_tokens=1) of these limits, {first:,} bytes")
        shrinks = first_shrinking(buffers, arena.symbols(1))
        if shrinks is not None:
            raise ValueError(
                f"buffers: buffer spec {shrinks.name!r}: size: {shrinks.formula} is not seen "
                "to grow with max_batch_tokens (it reads M in a condition or through %, or "
                "shrinks as M grows), so the largest max_batch_tokens that fits cannot be "
                "searched for; give max_batch_tokens to size one, or write the size with "
                "max() and min()")
        m, nbytes, following = _largest_fitting(arena, first, room)
        limited_by = "budget" if following is not None else "formulas"
    left = room - nbytes
    kv_tokens = left // kv if kv else 0
    return ArenaFit(m, nbytes, budget, left, limited_by, following, kv, kv_tokens,
                    kv_tokens * (kv or 0), left - kv_tokens * (kv or 0),
                    check_index(max_seq_len, "max_seq_len"),
                    check_index(kv_block_size, "kv_block_size"),
                    check_index(max_batch_size, "max_batch_size"), tp, reserve, gran, guard,
                    margin, arena.evaluations, pool)
