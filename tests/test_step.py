"""Step inputs (metrale.StepInputs, src/metrale/_arena/_step.pyx) and
zero_all_rows(tokens_at=...): the token count read where the work runs.

Expectations come from ARENA.md, written out again in helpers
(expected_rows_length) and from DecodeMetaLayout's worked offsets, never
from the code under test; every test runs on the host backend and, where
there is one, on CUDA."""

import threading

import numpy as np
import pytest

import metrale
from metrale import BufferArena, BufferSizes, DecodeMetaLayout, ModelConfig
from metrale.errors import MetraleError, OutOfMemoryError
from metrale.sizes import BUFFER_NAMES
from metrale.testing import FaultyBackend

from helpers import (COMPACT, NOENV, PRESET, Mem, check_zeroed, expected_rows_length, fill_all,
                     live_counts, new, ptr_of, rows_expectation, slab_base)
from reference_oracle import NAMES, ROWS, ZERO_ALL

SENTINEL = 0xAB             # what helpers.fill_all writes
META_AT = 32_768            # ARENA.md §4.1: the decode metadata at scratch + 32,768
COUNT_AT = META_AT - 16     # where StepInputs keeps the count (docs/step-inputs.md)


def read_all(arena, gpu):
    m = Mem(arena, gpu)
    return {name: m.read(name) for name in NAMES}


def check_rows(arena, got, tokens, spared=()):
    """Every buffer: the bytes zero_all_rows(tokens) clears (ARENA §5.2) are 0,
    the rest still the sentinel; `spared`: (name, start, end) byte ranges of a
    buffer checked by the caller instead."""
    expect = rows_expectation(arena.sizes(), arena.max_batch_tokens(), tokens)
    check_zeroed(arena, None, expect, spared=spared, got=got)


def count_cell(arena, gpu, name, offset, value):
    """Write the int32 `value` at `offset` of buffer `name`; its address."""
    p = ptr_of(arena, name) + offset
    if isinstance(gpu, metrale.HostBackend):
        np.asarray(arena.view(name, "uint8"))[offset:offset + 4] = \
            np.frombuffer(np.int32(value).tobytes(), np.uint8)
    else:
        gpu.upload(p, np.int32(value).tobytes())
    return p


# -- zero_all_rows(tokens_at=...) ----------------------------------------------------

@pytest.mark.parametrize("m", [1, 16, 100, 1000])
@pytest.mark.parametrize("tokens", [0, 1, 2, 15, 16, 17, 99, 100, 1000, 5000, -1, -(2**31)])
def test_device_count_clears_what_the_host_count_does(backend, m, tokens):
    with new(backend, COMPACT, m=m) as arena:
        fill_all(arena, backend)
        at = count_cell(arena, backend, "token_ids", 0, tokens)   # token_ids: never zeroed
        arena.zero_all_rows(stream=0, tokens_at=at)
        got = read_all(arena, backend)
        # a negative count clears everything, like tokens >= max_batch_tokens
        check_rows(arena, got, tokens if tokens >= 0 else m, spared=[("token_ids", 0, 4)])
        assert got["token_ids"][:4].view(np.int32)[0] == tokens


@pytest.mark.parametrize("name,row", [("hidden_states", 0), ("hidden_states", 5), ("logits", 0),
                                      ("scratch", 1), ("expert_down_out", 3)])
def test_a_count_inside_a_cleared_buffer_keeps_its_bytes(backend, name, row):
    m, tokens = 100, 7
    with new(backend, COMPACT, m=m) as arena:
        fill_all(arena, backend)
        n = getattr(arena.sizes(), name)
        off = (n // m) * row // 4 * 4 if name in ROWS else 256 * row
        at = count_cell(arena, backend, name, off, tokens)
        arena.zero_all_rows(tokens_at=at)
        got = read_all(arena, backend)
        check_rows(arena, got, tokens, spared=[(name, off, off + 4)])
        assert got[name][off:off + 4].view(np.int32)[0] == tokens


def test_device_count_matches_the_host_count_byte_for_byte_on_the_host():
    """The whole slab, padding included: the device-count table and the
    host-count ranges clear the same bytes."""
    import ctypes
    gpu = metrale.HostBackend()
    for m in (1, 15, 16, 100, 1000):
        with new(gpu, PRESET, m=m) as a, new(gpu, PRESET, m=m) as b:
            bases = []
            for arena in (a, b):
                base = slab_base(arena)
                ctypes.memset(base, SENTINEL, arena.slab_bytes())
                bases.append(base)
            cell = ptr_of(b, "token_ids")
            for tokens in (0, 1, 15, 17, m - 1, m, m + 5):
                ctypes.memmove(cell, np.int32(tokens).tobytes(), 4)
                ctypes.memmove(ptr_of(a, "token_ids"), np.int32(tokens).tobytes(), 4)
                a.zero_all_rows(tokens=tokens)
                b.zero_all_rows(tokens_at=cell)
                assert ctypes.string_at(bases[0], a.slab_bytes()) == \
                    ctypes.string_at(bases[1], b.slab_bytes()), (m, tokens)


def test_arenas_zeroing_at_once_on_two_streams_each_clear_their_own(gpu):
    """Each arena's device-count launches take their tiles from a counter of
    their own: two arenas zeroed again and again on two streams at once (one
    count trimming, the other clearing everything) both end exact."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    m = 1000
    with new(gpu, PRESET, m=m) as a, new(gpu, PRESET, m=m) as b:
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        for _ in range(5):
            for arena in (a, b):
                fill_all(arena, gpu)
            cells = [count_cell(a, gpu, "token_ids", 0, 17), count_cell(b, gpu, "token_ids", 0, m)]
            torch.cuda.synchronize()
            for arena, cell, s in zip((a, b), cells, streams):
                with torch.cuda.stream(s):
                    torch.cuda._sleep(1_000_000)        # both launches start together
                arena.zero_all_rows(stream=s, tokens_at=cell)
            torch.cuda.synchronize()
            check_rows(a, read_all(a, gpu), 17, spared=[("token_ids", 0, 4)])
            check_rows(b, read_all(b, gpu), m, spared=[("token_ids", 0, 4)])


def test_each_arena_borrows_a_work_counter_until_released_and_past_the_last_zeroes_in_shares(gpu):
    """An arena borrows one of the backend's 4096 counters at its first
    device-count zeroing (not before) and gives it back when released, or
    when collected unreleased, from a reference cycle too; arenas that find
    none left clear exactly the same bytes (each block a fixed share).  4098
    arenas of 3.8 MB."""
    import gc
    import warnings
    from helpers import Cycle
    gc.collect()
    lent0, total = gpu.rows_at_counters()
    assert total == 4096
    arenas = []
    for i in range(total - lent0 + 2):
        a = new(gpu, COMPACT, m=8, seq=16, bs=1)
        arenas.append(a)
        assert gpu.rows_at_counters()[0] == min(lent0 + i, total)     # not before its first
        a.zero_all_rows(tokens_at=count_cell(a, gpu, "token_ids", 0, 5))
        assert gpu.rows_at_counters() == (min(lent0 + i + 1, total), total)
    for a in arenas[:2] + arenas[-2:]:          # two with a counter, two without
        fill_all(a, gpu)
        a.zero_all_rows(tokens_at=count_cell(a, gpu, "token_ids", 0, 5))      # of 8 rows
        gpu.synchronize()
        check_rows(a, read_all(a, gpu), 5, spared=[("token_ids", 0, 4)])
    arenas[0].release()
    assert gpu.rows_at_counters()[0] == total - 1       # back at release
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)      # unreleased, on purpose
        Cycle(arena=arenas[1], gpu=gpu)
        del arenas[:2], a
        gc.collect()
    assert gpu.rows_at_counters()[0] == total - 2       # back when collected
    a = new(gpu, COMPACT, m=8, seq=16, bs=1)   # takes one of them
    fill_all(a, gpu)
    a.zero_all_rows(tokens_at=count_cell(a, gpu, "token_ids", 0, 3))
    gpu.synchronize()
    check_rows(a, read_all(a, gpu), 3, spared=[("token_ids", 0, 4)])
    assert gpu.rows_at_counters()[0] == total - 1
    for b in arenas:
        b.release()
    assert gpu.rows_at_counters()[0] == lent0 + 1
    a.release()
    assert gpu.rows_at_counters() == (lent0, total)


def test_tokens_at_is_checked(backend):
    with new(backend, COMPACT, m=16) as arena:
        p = arena.token_ids()
        with pytest.raises(TypeError, match="tokens or tokens_at, not both"):
            arena.zero_all_rows(tokens=1, tokens_at=p)
        with pytest.raises(TypeError, match="tokens_at"):
            arena.zero_all_rows()
        with pytest.raises(TypeError, match="tokens_at"):
            arena.zero_all_rows(tokens_at="0x10")
        for bad in (0, p + 2):
            with pytest.raises(ValueError, match="tokens_at"):
                arena.zero_all_rows(tokens_at=bad)
        host = np.zeros(16, dtype=np.int32)
        for bad in (host.ctypes.data // 16 * 16 + 16, 2**64 - 4, 64):
            with pytest.raises(ValueError, match="tokens_at: .* is not inside memory"):
                arena.zero_all_rows(tokens_at=bad)
        with pytest.raises(ValueError, match="tokens_at"):
            arena.zero_all_rows(tokens_at=-4)
    with pytest.raises(MetraleError, match="released"):
        arena.zero_all_rows(tokens_at=p)


def test_the_count_is_read_when_the_call_runs_on_the_host():
    gpu = FaultyBackend()
    with new(gpu, COMPACT, m=64) as arena:
        fill_all(arena, gpu)
        at = count_cell(arena, gpu, "token_ids", 0, 3)
        gpu.inject_fault("d2h")
        with pytest.raises(MetraleError, match="HOST_INJECTED_FAULT"):
            arena.zero_all_rows(tokens_at=at)
        got = read_all(arena, gpu)
        assert all((got[n] == SENTINEL).all() for n in ZERO_ALL)     # nothing cleared
        # the next call reads the count now there
        count_cell(arena, gpu, "token_ids", 0, 9)
        arena.zero_all_rows(tokens_at=at)
        check_rows(arena, read_all(arena, gpu), 9, spared=[("token_ids", 0, 4)])


# -- StepInputs ----------------------------------------------------------------------

def test_views_are_the_decode_layout():
    gpu = metrale.HostBackend()
    with BufferArena.new(COMPACT, 100, 4096, 16, 32, gpu) as arena:
        with arena.step_inputs() as st:
            R, B = 32, 4096 // 16 + 1                      # ARENA §1.2: R = max(32, bs), B
            assert (st.layout, st.max_blocks, st.max_batch_tokens) == \
                (DecodeMetaLayout.for_max_batch_size(32), B, 100)
            shapes = {"token_ids": ((100,), np.uint32), "count": ((1,), np.int32),
                      "positions": ((R,), np.uint32), "seq_slot": ((R,), np.int32),
                      "slots": ((R,), np.int64), "seq_lens": ((R,), np.int32),
                      "block_table": ((R, B), np.int32)}
            for name, (shape, dtype) in shapes.items():
                v = getattr(st, name)
                assert v.shape == shape and v.dtype == dtype and v.flags.writeable, name
            base = st.token_ids.ctypes.data
            scratch = arena.scratch() - arena.token_ids()
            # ARENA §4.2 at R = 32: offsets 0 / 128 / 256 / 512 / 768
            for name, off in (("positions", 0), ("seq_slot", 128), ("slots", 256),
                              ("seq_lens", 512), ("block_table", 768)):
                assert getattr(st, name).ctypes.data - base == scratch + META_AT + off, name
            assert st.count.ctypes.data - base == scratch + COUNT_AT
            # the span: token_ids up to the end of the metadata, 33,664 bytes at R = 32, B = 257
            assert st.nbytes == scratch + META_AT + 768 + 32 * B * 4
            assert st.device_span == (arena.token_ids(), st.nbytes)
            assert st.count_at == arena.scratch() + COUNT_AT
            assert "rows=32" in repr(st) and f"{st.nbytes} bytes" in repr(st)
            del v


def staged(st, rng, n):
    """Random inputs for n tokens; the step's rows (at most R) of metadata."""
    rows = min(n, st.layout.rows())
    st.fill(rng.integers(0, 2**32, n, dtype=np.uint32),
            positions=rng.integers(0, 2**32, rows, dtype=np.uint32),
            seq_slot=rng.integers(-1, 8, rows, dtype=np.int32),
            slots=rng.integers(-2**40, 2**40, rows, dtype=np.int64),
            seq_lens=rng.integers(0, 4096, rows, dtype=np.int32),
            block_table=rng.integers(0, 2**31, (rows, st.max_blocks), dtype=np.int32))


def check_uploaded(arena, st, got, tokens):
    """The slab after upload(): zero_all_rows(tokens) everywhere but the span,
    which holds the staging byte for byte."""
    host = np.frombuffer(st, dtype=np.uint8).copy()
    scr = arena.scratch() - arena.token_ids()
    tok_n = arena.sizes().token_ids
    assert (got["token_ids"] == host[:tok_n]).all()
    span_in_scratch = st.nbytes - scr
    assert (got["scratch"][:span_in_scratch] == host[scr:]).all()
    check_rows(arena, got, tokens, spared=[("token_ids", 0, tok_n),
                                           ("scratch", 0, span_in_scratch)])


@pytest.mark.parametrize("tokens", [0, 1, 31, 32, 33, 100, 128, 129])
def test_upload_is_the_staging_plus_zero_all_rows(backend, tokens):
    rng = np.random.default_rng(tokens)
    with BufferArena.new(COMPACT, 128, 1024, 16, 32, backend) as arena:
        with arena.step_inputs() as st:
            fill_all(arena, backend)
            staged(st, rng, min(tokens, 128))
            st.tokens = tokens
            h2d, launches = backend.h2d_count, getattr(backend, "launch_count", 0)
            st.upload(0)
            st.wait()
            assert backend.h2d_count == h2d + 1                  # one copy
            if hasattr(backend, "launch_count"):
                assert backend.launch_count == launches + 1      # one launch
            check_uploaded(arena, st, read_all(arena, backend), tokens)
            # without the zeroing only the span changes
            fill_all(arena, backend)
            st.upload(zero=False)
            st.wait()
            got = read_all(arena, backend)
            for name in ZERO_ALL:
                if name != "scratch":
                    assert (got[name] == SENTINEL).all(), name


def test_fill_checks_shapes_and_types():
    gpu = metrale.HostBackend()
    with BufferArena.new(COMPACT, 64, 512, 16, 40, gpu) as arena, arena.step_inputs() as st:
        R, B = 40, 512 // 16 + 1
        st.fill([1, 2, 3])
        assert st.tokens == 3 and list(st.token_ids[:4]) == [1, 2, 3, 0]
        st.fill(np.arange(64), tokens=10, block_table=np.ones((2, B), dtype=np.int32))
        assert st.tokens == 10 and (st.block_table[:2] == 1).all() and not st.block_table[2:].any()
        bad = [({"token_ids": np.arange(65)}, ValueError, "token_ids of shape"),
               ({"token_ids": [[1]]}, ValueError, "token_ids must be 1-D"),
               ({"token_ids": [1.5]}, TypeError, "token_ids must hold integers"),
               ({"token_ids": [1], "positions": np.arange(R + 1)}, ValueError, "positions"),
               ({"token_ids": [1], "slots": np.zeros((1, 1), int)}, ValueError, "slots must be 1-D"),
               ({"token_ids": [1], "block_table": np.zeros((1, B + 1), int)}, ValueError, "block_table"),
               ({"token_ids": [1], "block_table": np.zeros(3, int)}, ValueError, "block_table must be 2-D"),
               ({"token_ids": [1], "tokens": -1}, ValueError, "tokens"),
               ({"token_ids": [1], "tokens": 2**31}, ValueError, "tokens")]
        for kwargs, exc, match in bad:
            before = np.frombuffer(st, np.uint8).copy()
            with pytest.raises(exc, match=match):
                st.fill(**kwargs)
            assert (np.frombuffer(st, np.uint8) == before).all(), kwargs   # nothing written
        for value, exc in ((-1, ValueError), (2**31, ValueError), ("3", TypeError), (1.0, TypeError)):
            with pytest.raises(exc, match="tokens"):
                st.tokens = value
        st.tokens = 2**31 - 1
        assert st.count[0] == 2**31 - 1


def test_fill_refuses_values_its_regions_cannot_hold():
    """No value is wrapped: each region's element type bounds what it takes
    (uint32 token ids and positions, int32 slots of sequences and block
    tables, int64 KV slots), whatever the array's own type; an out-of-range
    value names its argument and nothing at all is written."""
    gpu = metrale.HostBackend()
    with BufferArena.new(COMPACT, 64, 512, 16, 40, gpu) as arena, arena.step_inputs() as st:
        st.fill([7, 8], positions=[1, 2])
        bad = [({"token_ids": [-1]}, "token_ids", "-1 .. -1"),
               ({"token_ids": [2**32]}, "token_ids", "4294967296"),
               ({"token_ids": [1, 2**40]}, "token_ids", "1099511627776"),
               ({"token_ids": np.array([-5], np.int8)}, "token_ids", "-5"),
               ({"token_ids": [1], "positions": [2**32 + 3]}, "positions", r"\[0, 4294967295\]"),
               ({"token_ids": [1], "seq_slot": [2**31]}, "seq_slot", "int32"),
               ({"token_ids": [1], "seq_lens": [-2**31 - 1]}, "seq_lens", "int32"),
               # a length is never negative, even in the region's own type
               ({"token_ids": [1], "seq_lens": [-5]}, "seq_lens", r"\[0, 2147483647\]"),
               ({"token_ids": [1], "seq_lens": np.array([3, -1], np.int32)}, "seq_lens", "-1"),
               ({"token_ids": [1], "slots": np.array([2**63], np.uint64)}, "slots", "int64"),
               ({"token_ids": [1], "block_table": [[2**31]]}, "block_table", "int32")]
        for kwargs, name, match in bad:
            before = np.frombuffer(st, np.uint8).copy()
            with pytest.raises(ValueError, match=name) as e:
                st.fill(**kwargs)
            assert match in str(e.value) or __import__("re").search(match, str(e.value)), e.value
            assert (np.frombuffer(st, np.uint8) == before).all(), kwargs   # nothing written
        for kwargs in ({"token_ids": [True]}, {"token_ids": [1], "slots": [1.0]},
                       {"token_ids": [1], "positions": ["a"]}, {"token_ids": [2**70]}):
            with pytest.raises(TypeError, match="must hold integers"):
                st.fill(**kwargs)
        # the extremes of each type go through exactly
        st.fill(np.array([0, 2**32 - 1], np.uint64), positions=[2**32 - 1], seq_slot=[-2**31],
                seq_lens=[2**31 - 1], slots=[-2**63, 2**63 - 1], block_table=[[-2**31, 2**31 - 1]])
        assert list(st.token_ids[:2]) == [0, 2**32 - 1] and st.positions[0] == 2**32 - 1
        assert st.seq_slot[0] == -2**31 and st.seq_lens[0] == 2**31 - 1
        assert list(st.slots[:2]) == [-2**63, 2**63 - 1]
        assert list(st.block_table[0, :2]) == [-2**31, 2**31 - 1]


def test_fill_without_token_ids():
    """fill(None) is refused (naming what is missing); only the metadata and
    the count can change with tokens=; an empty list is zero tokens."""
    gpu = metrale.HostBackend()
    with BufferArena.new(COMPACT, 64, 512, 16, 40, gpu) as arena, arena.step_inputs() as st:
        st.fill([5, 6, 7])
        for call in (lambda: st.fill(None), lambda: st.fill(token_ids=None), lambda: st.fill()):
            with pytest.raises(TypeError, match="token_ids"):
                call()
        st.fill(positions=[9, 9], tokens=2)
        assert st.tokens == 2 and list(st.token_ids[:3]) == [5, 6, 7] and st.positions[1] == 9
        st.fill([])
        assert st.tokens == 0 and list(st.token_ids[:3]) == [5, 6, 7]
        st.fill(np.zeros((0,), np.float64), block_table=np.zeros((0, 0)))
        assert st.tokens == 0


def test_step_inputs_arguments_follow_the_integer_rule():
    gpu = metrale.HostBackend()

    class Index:
        def __index__(self):
            return 40

    with BufferArena.new(COMPACT, 64, 512, 16, 40, gpu) as arena:
        with arena.step_inputs(max_blocks=Index()) as st:
            assert st.max_blocks == 40
        for value, exc in ((2**64 - 1, ValueError), (2**64, ValueError), (-1, ValueError),
                           (True, TypeError), (1.5, TypeError)):
            with pytest.raises(exc, match="max_blocks"):
                arena.step_inputs(max_blocks=value)
        assert gpu.live_host_alloc_count == 0


def test_release_refuses_while_a_view_lives_and_everything_after_refuses():
    gpu = metrale.HostBackend()
    arena = BufferArena.new(COMPACT, 64, 512, 16, 32, gpu)
    st = arena.step_inputs()
    ids = st.token_ids
    derived = ids[3:10]
    del ids
    with pytest.raises(BufferError, match="step inputs still have live views"):
        st.release()
    derived[:] = 7                                   # still valid memory
    del derived
    st.release()
    st.release()                                     # idempotent
    assert st.is_released() and "released" in repr(st)
    for op in (lambda: st.upload(), lambda: st.wait(), lambda: st.token_ids,
               lambda: st.tokens, lambda: setattr(st, "tokens", 1), lambda: st.fill([1]),
               lambda: memoryview(st)):
        with pytest.raises(MetraleError, match="released"):
            op()
    arena.release()
    assert live_counts(gpu) == (0, 0)


def test_upload_refuses_a_released_sleeping_or_resized_arena():
    gpu = metrale.HostBackend()
    arena = BufferArena.new(COMPACT, 64, 512, 16, 32, gpu, reserve=(128, 1024, 16, 64))
    st = arena.step_inputs()
    st.upload()
    arena.sleep()
    with pytest.raises(MetraleError, match="sleeping"):
        st.upload()
    with pytest.raises(MetraleError, match="sleeping"):
        arena.step_inputs()
    arena.wake()
    st.upload()
    arena.resize(max_batch_tokens=128)
    with pytest.raises(MetraleError, match="resized after these step inputs"):
        st.upload()
    with arena.step_inputs() as st2:
        assert st2.max_batch_tokens == 128
        st2.fill(np.arange(128), positions=np.arange(32))
        st2.upload()
        assert (np.asarray(arena.view("token_ids", "uint32")) == np.arange(128)).all()
    arena.release()
    with pytest.raises(MetraleError, match="released"):
        st.upload()
    st.release()


def test_reserved_arena_uploads_into_committed_memory(backend):
    """token_ids keeps its whole reserved room mapped: the span reaches scratch."""
    rng = np.random.default_rng(5)
    with BufferArena.new(COMPACT, 16, 512, 16, 32, backend, reserve=(4096, 1024, 16, 64)) as arena:
        assert arena.scratch() - arena.token_ids() >= 4 * 4096
        with arena.step_inputs() as st:
            fill_all(arena, backend)
            staged(st, rng, 16)
            st.tokens = 5
            st.upload()
            st.wait()
            check_uploaded(arena, st, read_all(arena, backend), 5)
            arena.zero_all_rows(tokens_at=st.count_at)         # inside a reserved slab too


def test_from_sizes_arenas_name_their_block_count():
    gpu = metrale.HostBackend()
    s = BufferSizes.from_config(COMPACT, 64, 512, 16, 32, env=NOENV)
    with BufferArena.from_sizes(s, gpu) as arena, arena.step_inputs() as st:
        assert st.max_blocks == 512 // 16 + 1         # from the limits the sizes record
    by_hand = BufferSizes(**s.as_dict())
    with BufferArena.from_sizes(COMPACT, by_hand, 64, 32, gpu) as arena:
        with pytest.raises(TypeError, match="max_blocks"):
            arena.step_inputs()
        with pytest.raises(ValueError, match="max_blocks=.* does not fit scratch"):
            arena.step_inputs(max_blocks=10**6)
        with pytest.raises(ValueError, match="max_blocks"):
            arena.step_inputs(max_blocks=-1)
        with arena.step_inputs(max_blocks=33) as st:
            assert st.block_table.shape == (32, 33)


def test_failures_leave_nothing_behind():
    gpu = FaultyBackend()
    with BufferArena.new(COMPACT, 64, 512, 16, 32, gpu) as arena:
        gpu.inject_fault("host_alloc")
        with pytest.raises(OutOfMemoryError):
            arena.step_inputs()
        with arena.step_inputs() as st:
            fill_all(arena, gpu)
            st.fill(np.arange(8))
            gpu.inject_fault("h2d")
            with pytest.raises(MetraleError, match="HOST_INJECTED_FAULT"):
                st.upload()
            got = read_all(arena, gpu)
            assert all((got[n] == SENTINEL).all() for n in ZERO_ALL)   # nothing cleared
            st.upload()
            check_uploaded(arena, st, read_all(arena, gpu), 8)
    assert live_counts(gpu) == (0, 0)


def test_threads_uploading_while_one_releases_never_crash():
    gpu = metrale.HostBackend()
    for _ in range(20):
        arena = BufferArena.new(COMPACT, 64, 512, 16, 32, gpu)
        st = arena.step_inputs()
        st.fill(np.arange(64))
        errors, go = [], threading.Event()

        def work():
            go.wait()
            for _ in range(200):
                try:
                    st.upload()
                    st.tokens = 3
                except MetraleError as e:
                    if "released" not in str(e):
                        errors.append(e)
                    return

        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        go.set()
        st.release()
        for t in threads:
            t.join()
        assert not errors and st.is_released()
        arena.release()
    assert live_counts(gpu) == (0, 0)


def test_expected_rows_rule_is_the_one_the_views_assume():
    # the helper used above agrees with ARENA §5.2's worked example (M = 8193)
    # for a GEMM-tiled buffer ("Mp") and one its rows do not divide
    w = 32_768
    assert expected_rows_length("qkv_output", 8208 * w, 8193, 17) == 32 * w
    assert expected_rows_length("hidden_states", 1_000_003, 8193, 1) == 1_000_003


# -- one CUDA graph for every batch size (needs a GPU and torch) ------------------------

def _torch():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


@pytest.mark.parametrize("preset", ["qwen3-next-80b", "deepseek-v4", "nemotron-h"])
def test_one_graph_replays_every_batch_size(gpu, preset):
    """Captured once at capacity; each replay leaves the slab as eager
    zero_all_rows(n) followed by writing the staging, and as ARENA §5.2 says."""
    torch = _torch()
    M = 8192
    rng = np.random.default_rng(1)
    with BufferArena.new(ModelConfig.preset(preset), M, 4096, 16, 32, gpu) as arena:
        st = arena.step_inputs()
        s = torch.cuda.Stream()
        st.tokens = M
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            st.upload(s)
        sizes = arena.sizes()
        views = {n: torch.from_dlpack(arena.view(n, "uint8")) for n in BUFFER_NAMES
                 if getattr(sizes, n) and n != "norm_unit_w"}
        snap = {n: torch.empty_like(v) for n, v in views.items()}
        scr = arena.scratch() - arena.token_ids()
        in_scratch = st.nbytes - scr
        for n in (0, 1, 2, 15, 16, 17, 100, 4095, 4096, 8191, 8192, 8193, 100_000, -1):
            if n >= 0:
                staged(st, rng, min(n, M))
                st.tokens = n
            else:
                st.count[0] = n                       # a corrupt count: everything cleared
            host = torch.from_numpy(np.frombuffer(st, np.uint8).copy()).cuda()
            for v in views.values():
                v.fill_(SENTINEL)
            torch.cuda.synchronize()
            g.replay()
            st.wait()
            torch.cuda.synchronize()
            for name, v in views.items():
                snap[name].copy_(v)
            # eager: the host count, then the same bytes written
            for v in views.values():
                v.fill_(SENTINEL)
            arena.zero_all_rows(tokens=n if n >= 0 else M)
            torch.cuda.synchronize()
            views["token_ids"].copy_(host[:sizes.token_ids])
            views["scratch"][:in_scratch].copy_(host[scr:])
            torch.cuda.synchronize()
            for name, v in views.items():
                assert torch.equal(snap[name], v), f"{preset}: {name} differs at n={n}"
            # and independently, ARENA §5.2 (the span holds the staging)
            expect = rows_expectation(sizes, M, n if n >= 0 else M)
            for name, v in views.items():
                k = expect.get(name, 0)
                if name == "token_ids":
                    assert torch.equal(v, host[:sizes.token_ids])
                    continue
                if name == "scratch":
                    assert torch.equal(v[:in_scratch], host[scr:]) and not v[in_scratch:].any()
                    continue
                assert not v[:k].any(), f"{preset}: {name}: first {k} bytes not zero at n={n}"
                assert (v[k:] == SENTINEL).all(), f"{preset}: {name}: bytes past {k} at n={n}"
        del views, snap, host, g, v
        torch.cuda.synchronize()
        st.release()


def test_uploads_leave_a_debug_arenas_guard_bands_intact(backend):
    """The span crosses token_ids' guard band; the staging carries its pattern."""
    with BufferArena.new(COMPACT, 64, 512, 16, 32, backend, debug=True) as arena:
        with arena.step_inputs() as st:
            assert st.device_span[1] > arena.scratch() - arena.token_ids() > arena.sizes().token_ids
            st.fill(np.arange(64) + 1)
            st.upload()
            st.wait()
            assert arena.check_guards() == []
            arena.zero_all_rows(tokens_at=st.count_at)
            assert arena.check_guards() == []
