"""arena.peer_all_reduce on the host backend (docs/tensor-parallel.md): real
processes (two and three ranks, spawned) share their arenas' memfd slabs and
sum the live rows of their buffers through the mappings.  Every rank knows
every rank's input (each is made from a seed of its rank), so it checks its
result against sums computed independently (helpers.expected_sum: float32
adds in rank order by numpy and, for bfloat16, rounding to the nearest
bfloat16, ties to even, written with frexp and numpy's round-half-to-even,
not with the bit tricks of src/peer.c).  Rows past the count and every other buffer keep sentinels.
The CUDA half is tests/test_allreduce_cuda.py."""

import ctypes
import time

import numpy as np
import pytest

import metrale
from metrale import BufferArena, MetraleError
from metrale.tp import PeerGroup

from helpers import COMPACT, FileGroup, OneRank, expected_sum, rank_input, run_ranks

CFG = COMPACT
LIMITS = (64, 512, 16, 8)
M = LIMITS[0]
SENTINEL = 0x5A


def _bytes_at(ptr, n):
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))


def _group(path, rank, size, timeout=20.0):
    return PeerGroup(FileGroup(path, rank, size), timeout=timeout)


class Buf:
    """A buffer of the arena as a [rows, width] numpy array of its dtype."""

    def __init__(self, arena, name, ptr=None):
        spec = arena.sizes().buffers[name]
        self.dtype = spec.dtype
        nbytes = arena.nbytes(name)
        self.rows = M
        self.np = np.uint16 if self.dtype == "bfloat16" else np.float32
        self.width = nbytes // M // np.dtype(self.np).itemsize
        raw = _bytes_at(ptr if ptr is not None else arena.ptr(name), nbytes)
        self.a = raw.view(self.np).reshape(M, self.width)
        self.raw = raw


def _fill(arena, rank, names):
    """Sentinels over the whole slab, then each named buffer's input rows."""
    for n in arena.buffers:
        if arena.nbytes(n):
            _bytes_at(arena.ptr(n), arena.nbytes(n))[:] = SENTINEL
    for n in names:
        b = Buf(arena, n)
        b.a[:] = rank_input(rank, n, M, b.width, b.dtype)


def _check(arena, size, name, n, into=None, reduced=True):
    """Rows < n of `into` (default: `name`) hold the sum of every rank's input
    of `name`; rows >= n hold this rank's input (in place) or sentinels."""
    src, dst = Buf(arena, name), Buf(arena, into or name)
    inputs = [rank_input(r, name, M, src.width, src.dtype) for r in range(size)]
    want = expected_sum([x[:n] for x in inputs], src.dtype)
    got = dst.a[:n]
    ok = np.array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8))
    return ok, dst.raw[n * dst.width * dst.a.itemsize:].copy()


# -- what each rank runs -------------------------------------------------------------

def rank_reduce(rank, size, path):
    gpu = metrale.HostBackend()
    grp = _group(path, rank, size)
    out = {}
    with BufferArena.new(CFG, *LIMITS, gpu, group=grp) as a:
        me = Buf(a, "hidden_states")
        for n in (1, 5, 32, M, 0):
            _fill(a, rank, ["hidden_states", "ssm_gates"])
            grp.all_gather(("filled", n))
            a.peer_all_reduce("hidden_states", tokens=n)
            ok, tail = _check(a, size, "hidden_states", n)
            untouched = np.array_equal(
                tail.view(np.uint16).reshape(-1, me.width),
                rank_input(rank, "hidden_states", M, me.width, "bfloat16")[n:])
            gates_kept = np.array_equal(Buf(a, "ssm_gates").a,
                                        rank_input(rank, "ssm_gates", M, Buf(a, "ssm_gates").width,
                                                   "float32"))
            out[("in_place", n)] = (ok, untouched, gates_kept)
            grp.all_gather(("checked", n))
        # out of place, two buffers of two dtypes in one call, the count from memory
        _fill(a, rank, ["hidden_states", "ssm_gates"])
        count = np.ctypeslib.as_array((ctypes.c_int32 * 1).from_address(a.token_ids()))
        count[0] = 7
        grp.all_gather("filled 2")
        a.peer_all_reduce(["hidden_states", "ssm_gates"], out=["residual", "ssm_gates"],
                          tokens_at=a.token_ids())
        ok_h, tail_h = _check(a, size, "hidden_states", 7, into="residual")
        kept = np.array_equal(Buf(a, "hidden_states").a,
                              rank_input(rank, "hidden_states", M, me.width, "bfloat16"))
        g = Buf(a, "ssm_gates")
        inputs = [rank_input(r, "ssm_gates", M, g.width, "float32") for r in range(size)]
        want = expected_sum([x[:7] for x in inputs], "float32")
        ok_g = np.array_equal(g.a[:7], want)
        out["out_of_place"] = (ok_h, set(tail_h.tolist()) == {SENTINEL}, kept, ok_g,
                               np.array_equal(g.a[7:], inputs[rank][7:]))
        grp.all_gather("checked 2")
        # a negative count: every row
        _fill(a, rank, ["hidden_states"])
        count[0] = -1
        grp.all_gather("filled 3")
        a.peer_all_reduce("hidden_states", tokens_at=a.token_ids())
        out["all_rows"] = _check(a, size, "hidden_states", M)[0]
        grp.all_gather("checked 3")
        # many calls in a row: the barriers' counts stay in step (each call
        # multiplies the ones by the rank count, as float32 adds in rank order)
        _fill(a, rank, [])
        g.a[:4] = 1.0
        grp.all_gather("filled 4")
        t0 = time.perf_counter()
        for _ in range(60):
            a.peer_all_reduce("ssm_gates", tokens=4)
        want = np.float32(1.0)
        for _ in range(60):
            acc = want
            for _ in range(size - 1):
                acc = np.float32(acc + want)
            want = acc
        out["repeated"] = (set(g.a[:4].ravel().tolist()) == {float(want)},
                           time.perf_counter() - t0)
        grp.all_gather("done")
    return out


def rank_late(rank, size, path):
    """Rank 1 never reduces: rank 0's barrier gives up after its timeout,
    and rank 0's reductions stay refused."""
    gpu = metrale.HostBackend()
    grp = _group(path, rank, size)
    out = {}
    with BufferArena.new(CFG, *LIMITS, gpu, group=grp) as a:
        if rank == 0:
            t0 = time.perf_counter()
            with pytest.raises(MetraleError, match="rank 0 waited more than 0.3 s for rank 1"):
                a.peer_all_reduce("hidden_states", tokens=4, timeout=0.3)
            out["waited"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            with pytest.raises(MetraleError, match="stay refused"):
                a.peer_all_reduce("hidden_states", tokens=4, timeout=5.0)
            out["refused_at_once"] = time.perf_counter() - t0
            with pytest.raises(MetraleError, match="waited too long for rank 1"):
                a.check_peer_reduce()
        grp.all_gather("done")
        if rank == 1:
            a.check_peer_reduce()       # rank 1 never failed
    return out


# -- two and three processes -----------------------------------------------------------

@pytest.mark.parametrize("size", [2, 3])
def test_ranks_sum_their_live_rows(tmp_path, size):
    outs = run_ranks(rank_reduce, size, args=(str(tmp_path),))
    for out in outs:
        for n in (1, 5, 32, M, 0):
            assert out[("in_place", n)] == (True, True, True), n
        assert out["out_of_place"] == (True, True, True, True, True)
        assert out["all_rows"]
        assert out["repeated"][0]


def test_a_peer_that_never_calls_is_a_timeout_not_a_hang(tmp_path):
    outs = run_ranks(rank_late, 2, args=(str(tmp_path),))
    assert 0.3 <= outs[0]["waited"] < 5.0
    assert outs[0]["refused_at_once"] < 1.0


# -- one process ---------------------------------------------------------------------------

def _solo():
    return BufferArena.new(CFG, *LIMITS, metrale.HostBackend(), group=OneRank())


def test_one_rank_is_the_identity_or_a_copy():
    with _solo() as a:
        _fill(a, 0, ["hidden_states"])
        before = Buf(a, "hidden_states").a.copy()
        a.peer_all_reduce("hidden_states", tokens=9)
        assert np.array_equal(Buf(a, "hidden_states").a, before)
        a.peer_all_reduce("hidden_states", tokens=9, out="residual")
        r = Buf(a, "residual")
        assert np.array_equal(r.a[:9], before[:9])
        assert set(r.raw[9 * r.width * 2:].tolist()) == {SENTINEL}
        a.check_peer_reduce()


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(names=3, tokens=1), TypeError, "names must be a buffer name"),
    (dict(names=["hidden_states", 3], tokens=1), TypeError, "names: buffer names must be str"),
    (dict(names=[], tokens=1), ValueError, "1 to 16 buffers"),
    (dict(names=["hidden_states"] * 17, tokens=1), ValueError, "1 to 16 buffers"),
    (dict(names="nope", tokens=1), ValueError, "names: .*nope"),
    (dict(names=["hidden_states", "hidden_states"], tokens=1), ValueError, "named twice"),
    (dict(names="token_ids", tokens=1), ValueError, "'token_ids' holds uint32"),
    (dict(names="logits", tokens=1), ValueError, "'logits' is not token-major"),
    (dict(names="norm_unit_w", tokens=1), ValueError, "'norm_unit_w' is not token-major"),
    (dict(names="hidden_states", tokens=1, out="ssm_gates"), ValueError, "does not have the rows"),
    (dict(names=["hidden_states", "residual"], tokens=1, out=["residual", "norm_output"]),
     ValueError, "'residual' is also an input"),
    (dict(names="hidden_states", tokens=1, out=["residual", "norm_output"]), ValueError,
     "2 buffers for 1 names"),
    (dict(names="hidden_states"), TypeError, "missing its tokens"),
    (dict(names="hidden_states", tokens=1, tokens_at=8), TypeError, "not both"),
    (dict(names="hidden_states", tokens=-1), ValueError, "tokens"),
    (dict(names="hidden_states", tokens_at=6), ValueError, "4-byte aligned"),
    (dict(names="hidden_states", tokens_at=1 << 40), ValueError, "not inside memory"),
    (dict(names="hidden_states", tokens=1, timeout=0), ValueError, "timeout"),
    (dict(names="hidden_states", tokens=1, timeout=float("nan")), ValueError, "timeout"),
    (dict(names="hidden_states", tokens=1, timeout="1"), TypeError, "timeout"),
    (dict(names="hidden_states", tokens=1, stream="s"), TypeError, "stream"),
])
def test_bad_arguments_are_refused_naming_them(kwargs, error, match):
    with _solo() as a:
        _fill(a, 0, ["hidden_states"])
        before = Buf(a, "hidden_states").a.copy()
        with pytest.raises(error, match=match):
            a.peer_all_reduce(**kwargs)
        assert np.array_equal(Buf(a, "hidden_states").a, before)


def test_a_count_inside_the_buffers_it_writes_is_refused():
    with _solo() as a:
        with pytest.raises(ValueError, match="lies in 'hidden_states'"):
            a.peer_all_reduce("hidden_states", tokens_at=a.hidden_states() + 64)
        with pytest.raises(ValueError, match="lies in 'residual'"):
            a.peer_all_reduce("hidden_states", out="residual", tokens_at=a.residual())
        count = np.ctypeslib.as_array((ctypes.c_int32 * 1).from_address(a.token_ids()))
        count[0] = 3
        a.peer_all_reduce("hidden_states", tokens_at=a.token_ids())     # elsewhere: fine


def test_unshared_and_released_arenas_refuse():
    gpu = metrale.HostBackend()
    with BufferArena.new(CFG, *LIMITS, gpu) as a:
        with pytest.raises(MetraleError, match="not shared"):
            a.peer_all_reduce("hidden_states", tokens=1)
        with pytest.raises(MetraleError, match="not shared"):
            a.check_peer_reduce()
    a = _solo()
    a.release()
    with pytest.raises(MetraleError, match="released"):
        a.peer_all_reduce("hidden_states", tokens=1)


def test_user_code_in_the_arguments_runs_before_the_arena_is_held():
    """A stream object whose protocol releases the arena: converted before
    the call holds the arena, so the release goes through and the call
    then refuses (no deadlock, no use of freed memory)."""
    from helpers import HookStream
    a = _solo()
    stream = HookStream(a.release)
    with pytest.raises(MetraleError, match="released"):
        a.peer_all_reduce("hidden_states", tokens=1, stream=stream)
    assert a.is_released()
