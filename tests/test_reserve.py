"""Reserved arenas (docs/stable-addresses.md): pointers that never move through
resize, sleep and wake; physical memory that follows the current limits; the
fused zeroing over non-contiguous buffers; every failure leaves nothing mapped
or reserved behind.  Each test runs on the host backend and, where a GPU is
usable, on CUDA (the `backend` fixture)."""

import threading
import time

import pytest

import metrale
from metrale import BufferArena, BufferSizes, MetraleError, OutOfMemoryError
from metrale.sizes import BUFFER_NAMES
from metrale.testing import FaultyBackend

from helpers import (COMPACT, NOENV, check_zeroed, fill_all, needed_bytes, resident_in,
                     rows_expectation, slab_base, vm_counts)
from reference_oracle import PREFILL, ZERO_ALL

CFG = COMPACT
LIMITS = (64, 512, 16, 8)
TOP = (512, 1024, 16, 16)


def reserved(gpu, limits=LIMITS, top=TOP):
    return BufferArena.new(CFG, *limits, gpu, reserve=top)


def pointers(arena):
    return [arena.buffers[n].ptr for n in BUFFER_NAMES]


def test_pointers_never_move(backend):
    before = vm_counts(backend)
    with reserved(backend) as a:
        assert a.is_reserved() and not a.is_sleeping()
        ptrs = pointers(a)
        small = a.committed_bytes()
        hs = a.hidden_states()
        a.resize(max_batch_tokens=512, max_seq_len=1024, max_batch_size=16)
        assert pointers(a) == ptrs and a.hidden_states() == hs
        assert a.max_batch_tokens() == 512
        assert a.sizes() == BufferSizes.from_config(CFG, *TOP, target=backend.target(), env=NOENV)
        assert a.norm_output_bytes() == a.sizes().norm_output
        assert a.committed_bytes() > small
        a.resize(*LIMITS)
        assert pointers(a) == ptrs and a.committed_bytes() == small
        a.sleep()
        assert a.is_sleeping() and a.committed_bytes() == 0 and pointers(a) == ptrs
        assert backend.mapped_bytes == before[1]
        a.wake()
        assert pointers(a) == ptrs and a.committed_bytes() == small
    assert vm_counts(backend) == before


def test_physical_memory_is_the_current_sizes_rounded_to_granules(backend):
    with reserved(backend) as a:
        g = a.committed_bytes()
        assert a.slab_bytes() >= g > 0
        sizes = a.sizes()
        # every buffer's size rounded up to the granule, which the host and
        # CUDA report (page size, 2 MiB); only token_ids and scratch share one
        gran = _granularity(a)
        want = needed_bytes(a, gran)
        assert g == want
        # few physical handles: at most one per buffer
        assert backend.handle_count <= sum(1 for n in BUFFER_NAMES if getattr(sizes, n))


def _granularity(a):
    """The allocation granularity, as the gcd of the buffers' sub-range offsets
    (each a multiple of it but scratch's, which follows token_ids at once; with
    40-odd buffers of unrelated sizes, the gcd is it)."""
    import math
    return math.gcd(*(a.buffers[n].offset or 0 for n in BUFFER_NAMES if n != "scratch"))


@pytest.mark.parametrize("helper", ["zero_all", "zero_prefill_essentials", "rows1", "rows17",
                                    "rows_all"])
def test_zeroing_follows_the_current_limits(backend, helper):
    with reserved(backend) as a:
        for limits in (TOP, LIMITS):
            a.resize(*limits)
            m = fill_all(a, backend)
            sizes, mbt = a.sizes(), limits[0]
            if helper == "zero_all":
                a.zero_all()
                expect = {n: getattr(sizes, n) for n in ZERO_ALL}
            elif helper == "zero_prefill_essentials":
                a.zero_prefill_essentials()
                expect = {n: getattr(sizes, n) for n in PREFILL}
            else:
                tokens = 10 ** 9 if helper == "rows_all" else int(helper[4:])
                a.zero_all_rows(tokens=tokens)
                expect = rows_expectation(sizes, mbt, tokens)
            if not isinstance(backend, metrale.HostBackend):
                backend.synchronize()
            check_zeroed(a, m, expect)


def test_zero_all_is_one_operation(backend):
    with reserved(backend) as a:
        count = lambda: (backend.memset_count, getattr(backend, "launch_count", 0))
        before = count()
        a.zero_all()
        after = count()
        if isinstance(backend, metrale.HostBackend):
            assert after[0] - before[0] <= len(ZERO_ALL)   # host: one memset per range
        else:
            assert (after[0] - before[0]) + (after[1] - before[1]) == 1


def test_sleep_keeps_and_wake_restores(backend):
    with reserved(backend) as a:
        m = fill_all(a, backend)
        keep = ("hidden_states", "gate_logits_f32", "norm_unit_w")
        kept = {n: m.read(n) for n in keep}
        a.sleep(keep=keep)
        with pytest.raises(MetraleError, match="sleeping"):
            a.zero_all()
        with pytest.raises(MetraleError, match="sleeping"):
            a.view("logits", "uint8")
        with pytest.raises(MetraleError, match="already sleeping"):
            a.sleep()
        assert a.logits() != 0
        a.wake()
        with pytest.raises(MetraleError, match="not sleeping"):
            a.wake()
        for n in keep:
            assert (m.read(n) == kept[n]).all(), n
        for n in ZERO_ALL:
            if n not in keep:
                assert not m.read(n).any(), n


def test_wake_zeroes_norm_unit_w(backend):
    with reserved(backend) as a:
        m = fill_all(a, backend)
        a.sleep()
        a.wake()
        assert not m.read("norm_unit_w").any()


def test_views_block_reshapes(backend):
    # a view refuses the reshapes that give its memory back: a sleep that
    # discards its buffer, a resize that shrinks it (issue 25: a resize that
    # grows it, or a sleep that offloads it, keeps it; tests/test_offload.py)
    with reserved(backend) as a:
        v = a.view("logits", "uint8")
        with pytest.raises(BufferError, match="logits"):
            a.sleep()
        a.resize(max_batch_tokens=128)
        with pytest.raises(BufferError, match="logits"):
            a.resize(max_batch_tokens=64)
        assert not a.is_sleeping() and a.max_batch_tokens() == 128
        del v
        a.sleep()
        a.wake()


def test_limits_past_the_reservation(backend):
    with reserved(backend) as a:
        with pytest.raises(ValueError, match="max_batch_tokens=513 exceeds the reserved"):
            a.resize(max_batch_tokens=513)
        with pytest.raises(ValueError, match="max_seq_len"):
            a.resize(max_seq_len=4096)
    with pytest.raises(ValueError, match="max_seq_len=100 is below the current"):
        BufferArena.new(CFG, *LIMITS, backend, reserve=(64, 100, 16, 8))
    with pytest.raises(ValueError, match="unknown limit"):
        BufferArena.new(CFG, *LIMITS, backend, reserve={"tokens": 9})
    with pytest.raises(TypeError):
        BufferArena.new(CFG, *LIMITS, backend, reserve=512)
    with BufferArena.new(CFG, *LIMITS, backend, reserve={"max_batch_tokens": 128}) as a:
        a.resize(max_batch_tokens=128)
        with pytest.raises(ValueError, match="max_seq_len"):
            a.resize(max_seq_len=1024)


def test_from_sizes_with_reserve_sizes(backend):
    t = backend.target()
    s = BufferSizes.from_config(CFG, *LIMITS, target=t, env=NOENV)
    top = BufferSizes.from_config(CFG, *TOP, target=t, env=NOENV)
    with pytest.raises(ValueError, match="exceed its reserved"):
        BufferArena.from_sizes(top, backend, reserve_sizes=s)
    with BufferArena.from_sizes(s, backend, reserve_sizes=top) as a:
        ptrs = pointers(a)
        with pytest.raises(MetraleError, match="pass sizes="):
            a.resize(max_batch_tokens=128)
        a.resize(sizes=top, max_batch_tokens=512, max_batch_size=16)
        assert a.sizes() == top and pointers(a) == ptrs
        with pytest.raises(ValueError, match="above its reserved"):
            a.resize(sizes=top.replace(logits=top.logits * 4))


def test_unreserved_arenas_refuse_reshapes(backend):
    with BufferArena.new(CFG, *LIMITS, backend) as a:
        assert not a.is_reserved() and not a.is_sleeping()
        for call in (lambda: a.resize(max_batch_tokens=8), a.sleep, a.wake):
            with pytest.raises(MetraleError, match="no reservation"):
                call()


def test_release_of_a_sleeping_arena_frees_everything(backend):
    before = vm_counts(backend)
    a = reserved(backend)
    a.sleep(keep=("hidden_states",))
    a.release()
    assert a.is_released() and a.hidden_states() == 0
    assert vm_counts(backend) == before
    with pytest.raises(MetraleError, match="released"):
        a.wake()


def test_host_resident_memory_follows_sleep_and_wake():
    # Read at the slab's own addresses (/proc/self/smaps), not the whole
    # process's: under AddressSanitizer (CI's sanitizer stage) the rest of the
    # process makes and frees resident pages between two readings, which made
    # a whole-process reading flaky there.
    gpu = metrale.HostBackend()
    with BufferArena.new(metrale.ModelConfig.preset("qwen3-next-80b"), 512, 4096, 16, 32, gpu,
                         reserve=(512, 4096, 16, 32)) as a:
        m = fill_all(a, gpu)            # touch every page
        del m
        lo = slab_base(a)
        hi = lo + a.slab_bytes()
        committed = a.committed_bytes()
        assert committed > 64 << 20
        assert resident_in(lo, hi) >= 0.99 * committed
        a.sleep()
        assert resident_in(lo, hi) == 0
        a.wake()
        fill_all(a, gpu)
        assert resident_in(lo, hi) >= 0.99 * committed


# -- failures: nothing left mapped or reserved ----------------------------------------

@pytest.mark.parametrize("op", ["reserve", "create", "map", "set_access"])
@pytest.mark.parametrize("nth", [1, 2, 5])
def test_construction_failures_leave_nothing(op, nth):
    gpu = FaultyBackend()
    gpu.inject_fault(op, nth)
    try:
        a = reserved(gpu)
    except OutOfMemoryError:
        assert vm_counts(gpu) == (0, 0, 0)
    else:                       # fewer steps than nth: it succeeded
        assert op == "reserve" and nth > 1
        a.release()
        assert vm_counts(gpu) == (0, 0, 0)


@pytest.mark.parametrize("op", ["create", "map", "set_access"])
@pytest.mark.parametrize("nth", [1, 3])
def test_failed_growth_leaves_the_arena_as_it_was(op, nth):
    gpu = FaultyBackend()
    with reserved(gpu) as a:
        state = (a.sizes(), a.committed_bytes(), pointers(a), vm_counts(gpu))
        gpu.inject_fault(op, nth)
        with pytest.raises(OutOfMemoryError):
            a.resize(*TOP)
        assert (a.sizes(), a.committed_bytes(), pointers(a), vm_counts(gpu)) == state
        gpu.clear_faults()
        a.resize(*TOP)
        a.zero_all()
    assert vm_counts(gpu) == (0, 0, 0)


@pytest.mark.parametrize("op", ["create", "map", "set_access", "h2d", "memset"])
def test_failed_wake_still_sleeps(op):
    gpu = FaultyBackend()
    with reserved(gpu) as a:
        m = fill_all(a, gpu)
        kept = m.read("hidden_states")
        a.sleep(keep=("hidden_states",))
        gpu.inject_fault(op)
        with pytest.raises((OutOfMemoryError, MetraleError)):
            a.wake()
        assert a.is_sleeping() and gpu.mapped_bytes == 0
        a.wake()
        assert (m.read("hidden_states") == kept).all()
    assert vm_counts(gpu) == (0, 0, 0)


@pytest.mark.parametrize("op", ["host_alloc", "copy"])     # the copies out are "copy"s
def test_failed_sleep_copy_changes_nothing(op):
    gpu = FaultyBackend()
    with reserved(gpu) as a:
        committed = a.committed_bytes()
        gpu.inject_fault(op)
        with pytest.raises((OutOfMemoryError, MetraleError)):
            a.sleep(keep=("hidden_states", "logits"))
        assert not a.is_sleeping() and a.committed_bytes() == committed
        a.zero_all()
    assert vm_counts(gpu) == (0, 0, 0)


def test_a_chunk_a_failed_sleep_left_goes_at_wake_if_unneeded():
    gpu = FaultyBackend()
    with reserved(gpu) as a:
        a.resize(*TOP)
        gpu.inject_fault("unmap", 3)
        with pytest.raises(MetraleError, match="INJECTED"):
            a.sleep()
        assert a.is_sleeping() and gpu.mapped_bytes > 0
        a.resize(*LIMITS)
        a.wake()
        gran = _granularity(a)
        need = needed_bytes(a, gran)
        assert a.committed_bytes() == gpu.mapped_bytes
        assert need <= a.committed_bytes()
    assert vm_counts(gpu) == (0, 0, 0)


@pytest.mark.parametrize("op", ["unmap", "release_handle"])
def test_failed_sleep_unmap_still_sleeps_and_wakes(op):
    gpu = FaultyBackend()
    with reserved(gpu) as a:
        committed = a.committed_bytes()
        gpu.inject_fault(op, 2)
        with pytest.raises(MetraleError, match="INJECTED"):
            a.sleep()
        assert a.is_sleeping()
        a.wake()
        assert a.committed_bytes() == committed
    assert gpu.reserved_bytes == 0 and gpu.mapped_bytes == 0


def test_failed_shrink_keeps_the_chunk_tracked():
    gpu = FaultyBackend()
    with reserved(gpu) as a:
        a.resize(*TOP)                  # one more chunk at the tail of each grown buffer
        gpu.inject_fault("unmap")
        with pytest.raises(MetraleError, match="INJECTED"):
            a.resize(*LIMITS)
        assert a.max_batch_tokens() == LIMITS[0]    # resized; one chunk still mapped
        a.resize(*TOP)
        a.resize(*LIMITS)
    assert vm_counts(gpu) == (0, 0, 0)


def test_failed_release_can_be_retried_by_the_collector():
    gpu = FaultyBackend()
    a = reserved(gpu)
    gpu.inject_fault("unreserve")
    with pytest.raises(MetraleError, match="INJECTED"):
        a.release()
    assert gpu.mapped_bytes == 0 and gpu.handle_count == 0
    del a
    import gc
    gc.collect()
    assert gpu.reserved_bytes == 0


# -- threads ------------------------------------------------------------------------

@pytest.mark.parametrize("reshape", ["resize", "sleep"])
def test_a_reshape_waits_for_the_operation_in_flight(reshape):
    gpu = FaultyBackend()
    with reserved(gpu) as a:
        before = (a.sizes(), a.committed_bytes())
        call = (lambda: a.resize(*TOP)) if reshape == "resize" else a.sleep
        other = threading.Thread(target=call)
        seen = {}

        def hook():                         # runs inside zero_all's memset, holding the arena
            other.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    a.zero_all_rows(tokens=1)
                except MetraleError as e:   # the reshape has begun: nothing new starts
                    seen["refused"] = str(e)
                    break
                time.sleep(0.001)
            time.sleep(0.02)
            seen["waiting"] = other.is_alive()
            seen["unchanged"] = (a.sizes(), a.committed_bytes()) == before

        gpu.inject_call("memset", hook)
        a.zero_all()
        other.join()
        assert "being resized" in seen["refused"]
        assert seen["waiting"] and seen["unchanged"]
        assert (a.sizes(), a.committed_bytes()) != before
        if reshape == "sleep":
            a.wake()


def test_a_reshape_inside_an_operation_is_refused():
    gpu = FaultyBackend()
    with reserved(gpu) as a:
        refused = []

        def hook():
            for call in (lambda: a.resize(*TOP), a.sleep, a.wake):
                with pytest.raises(MetraleError, match="inside an operation"):
                    call()
                refused.append(call)

        gpu.inject_call("memset", hook)
        a.zero_all()
        assert len(refused) == 3 and not a.is_sleeping()
        a.resize(*TOP)


def test_resize_waits_for_operations_and_refuses_new_ones():
    gpu = metrale.HostBackend()
    stop = threading.Event()
    errors = []

    with reserved(gpu) as a:
        def worker():
            while not stop.is_set():
                try:
                    a.zero_all_rows(tokens=3)
                    a.zero_all()
                except MetraleError as e:
                    if "sleeping (or being resized" not in str(e):
                        errors.append(e)
                time.sleep(0)           # let the reshaping thread have the GIL

        t = threading.Thread(target=worker)
        t.start()
        try:
            for _ in range(20):
                a.resize(*TOP)
                a.resize(*LIMITS)
                a.sleep()
                a.wake()
        finally:
            stop.set()
            t.join()
    assert not errors


def test_refused_reshapes_keep_the_state():
    gpu = metrale.HostBackend()
    with reserved(gpu) as a:
        with pytest.raises(MetraleError, match="not sleeping"):
            a.wake()
        a.zero_all()                    # still awake
        a.sleep()
        with pytest.raises(MetraleError, match="already sleeping"):
            a.sleep()
        with pytest.raises(MetraleError, match="sleeping"):
            a.zero_all()                # still asleep
        with pytest.raises(ValueError):
            a.resize(max_batch_tokens=10 ** 6)
        with pytest.raises(MetraleError, match="sleeping"):
            a.zero_all()                # still asleep
        a.wake()
        a.zero_all()


def test_resize_while_asleep_gives_back_what_a_shrink_cannot(backend):
    with reserved(backend, limits=TOP) as a:
        ptrs = pointers(a)
        m = fill_all(a, backend)
        kept = m.read("hidden_states")
        a.resize(*LIMITS)               # the arena was built at TOP: its chunks stay
        shrunk = a.committed_bytes()
        a.sleep(keep=("hidden_states",))
        a.resize(*LIMITS)               # asleep: only the limits change
        assert a.committed_bytes() == 0 and a.max_batch_tokens() == LIMITS[0]
        a.wake()
        gran = _granularity(a)
        sizes = a.sizes()
        need = needed_bytes(a, gran)
        assert a.committed_bytes() == need <= shrunk
        assert pointers(a) == ptrs
        assert (m.read("hidden_states") == kept[:sizes.hidden_states]).all()
        a.sleep(keep=("hidden_states",))
        a.resize(*TOP)                  # grown while asleep: wake maps it all
        a.wake()
        assert a.sizes().hidden_states > sizes.hidden_states
        assert (m.read("hidden_states")[:sizes.hidden_states] == kept[:sizes.hidden_states]).all()


# -- CUDA only: graphs captured over a reserved arena -----------------------------

def _cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


@pytest.mark.parametrize("tokens", [1, 17])
def test_graph_replays_after_wake_and_growth(gpu, tokens):
    torch = _cuda_torch()
    with reserved(gpu) as a:
        ptrs = pointers(a)
        stream = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=stream):
            a.zero_all_rows(stream=torch.cuda.current_stream(), tokens=tokens)
        old_sizes = a.sizes()
        expect = rows_expectation(old_sizes, LIMITS[0], tokens)
        torch.cuda.synchronize()
        a.sleep()
        a.wake()
        assert pointers(a) == ptrs
        for step in ("after wake", "after growth", "after shrink"):
            if step == "after growth":
                a.resize(*TOP)
            elif step == "after shrink":
                a.resize(*LIMITS)
            m = fill_all(a, gpu)
            g.replay()
            torch.cuda.synchronize()
            check_zeroed(a, m, expect)
            first = {n: m.read(n) for n in ("hidden_states", "logits")}
            g.replay()
            torch.cuda.synchronize()
            for n, data in first.items():
                assert (m.read(n) == data).all(), (step, n)     # byte-identical replays
        del g


def test_graph_with_a_writing_node_replays_after_wake_and_growth(gpu):
    """A graph capturing zero_all_rows and a node that writes a buffer (a
    device-to-device copy of a pattern into hidden_states, enqueued through
    the driver on the capturing stream), captured before sleep: after wake,
    a growth and a shrink each replay writes the same bytes at the same
    addresses, sentinel-checked around them."""
    import numpy as np
    torch = _cuda_torch()
    driver = pytest.importorskip("cuda.bindings.driver")
    tokens, n = 2, 1024                                 # one hidden_states row of COMPACT
    pattern = (np.arange(n) % 251).astype(np.uint8)
    with reserved(gpu) as a:
        ptrs = pointers(a)
        src = torch.from_numpy(pattern).cuda()
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=torch.cuda.Stream()):
            s = torch.cuda.current_stream()
            a.zero_all_rows(stream=s, tokens=tokens)
            (err,) = driver.cuMemcpyDtoDAsync(a.hidden_states(), src.data_ptr(), n,
                                              driver.CUstream(s.cuda_stream))
            assert err == driver.CUresult.CUDA_SUCCESS
        expect = rows_expectation(a.sizes(), LIMITS[0], tokens)
        k = expect.pop("hidden_states")
        assert k == 2 * n
        torch.cuda.synchronize()
        a.sleep()
        a.wake()
        for step in ("after wake", "after growth", "after shrink"):
            if step == "after growth":
                a.resize(*TOP)
            elif step == "after shrink":
                a.resize(*LIMITS)
            assert pointers(a) == ptrs, step
            m = fill_all(a, gpu)
            g.replay()
            torch.cuda.synchronize()
            hs = m.read("hidden_states")
            assert (hs[:n] == pattern).all() and not hs[n:k].any(), step
            assert (hs[k:] == 0xAB).all(), step
            m.fill("hidden_states", 0)      # checked above; the rest by the rows rule
            check_zeroed(a, m, dict(expect, hidden_states=a.sizes().hidden_states))
        del g, src


def test_clear_ranges_accepts_mapped_memory(backend):
    with reserved(backend) as a:
        n = a.sizes().logits        # 10 granules of 2 MiB at LIMITS, 24 at TOP
        backend.clear_ranges([(a.logits(), n)])
        g = _granularity(a)
        past = a.logits() + -(-n // g) * g          # reserved for growth, not mapped
        top = BufferSizes.from_config(CFG, *TOP, target=backend.target(), env=NOENV).logits
        assert past + 256 <= a.logits() + top
        with pytest.raises(ValueError):
            backend.clear_ranges([(past, 256)])


def test_cuda_memory_given_back(gpu):
    with reserved(gpu, limits=TOP) as a:
        before = gpu.mem_info()[0]
        committed = a.committed_bytes()
        a.sleep()
        freed = gpu.mem_info()[0] - before
        assert freed >= 0.99 * committed
        a.wake()
        assert before - gpu.mem_info()[0] < 0.01 * committed


# -- any sequence of reshapes keeps the invariants ------------------------------------

def test_random_reshape_sequences_keep_the_invariants():
    hyp = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")
    limits = st.tuples(st.sampled_from([1, 7, 64, 300, 512]), st.sampled_from([16, 512, 1024]),
                       st.just(16), st.sampled_from([1, 8, 16]))
    steps = st.lists(st.one_of(limits, st.just("sleep")), min_size=1, max_size=8)

    @hyp.settings(max_examples=25, deadline=None)
    @hyp.given(steps)
    def run(seq):
        gpu = metrale.HostBackend()
        with reserved(gpu) as a:
            ptrs = pointers(a)
            gran = _granularity(a)
            for step in seq:
                if step == "sleep":
                    a.sleep()
                    assert a.committed_bytes() == 0 == gpu.mapped_bytes
                    a.wake()
                else:
                    a.resize(*step)
                    assert a.max_batch_tokens() == step[0]
                sizes = a.sizes()
                need = needed_bytes(a, gran)
                assert pointers(a) == ptrs
                assert a.committed_bytes() == gpu.mapped_bytes >= need
                if step == "sleep":                 # a wake maps exactly what is needed,
                    assert a.committed_bytes() == need  # with at most one handle per buffer
                    assert gpu.handle_count <= sum(1 for n in BUFFER_NAMES if getattr(sizes, n))
                a.zero_all()
                a.zero_all_rows(tokens=5)
        assert vm_counts(gpu) == (0, 0, 0)

    run()


def test_summary_of_a_reserved_arena(backend):
    with reserved(backend) as a:
        s = a.summary()
        assert s.reserved and not s.sleeping and s.committed_bytes == a.committed_bytes()
        assert s.slab_bytes == a.slab_bytes() and "reserved" in str(s)
        assert f"{len(ZERO_ALL)} ranges" in str(s)
        a.sleep()
        s = a.summary()
        assert s.sleeping and s.committed_bytes == 0 and "(sleeping)" in str(s)
        a.wake()
    with BufferArena.new(CFG, *LIMITS, backend) as b:
        s = b.summary()
        assert not s.reserved and s.committed_bytes == b.slab_bytes() and "one range of" in str(s)


def test_the_summary_names_the_backend_without_its_allocation_counters():
    # A reserved arena maps its memory: the backend's live_bytes (its plain
    # allocations) would read 0 beside the megabytes mapped.
    from metrale._arena._summary import _backend_label
    class Named:
        def __init__(self, text):
            self.text = text

        def __repr__(self):
            return self.text

    with reserved(metrale.HostBackend()) as a:
        s = a.summary()
        assert s.backend == "HostBackend" and "live_" not in str(s)
        assert str(s).splitlines()[0] == "BufferArena on HostBackend"
    assert _backend_label(Named("CudaBackend(device=0, sm_count=132, cc=9.0, live_bytes=4096)")) \
        == "CudaBackend(device=0, sm_count=132, cc=9.0)"
    assert _backend_label(Named("FaultyBackend(live_alloc_count=1, live_bytes=2, armed={})")) \
        == "FaultyBackend(armed={})"


# -- arguments are converted before the arena is read or held ----------------------------

class _Shrinking:
    """An int-like (or dtype-like) whose conversion shrinks the arena first."""

    def __init__(self, arena, value):
        self.arena, self.value = arena, value

    def __index__(self):
        self.arena.resize(max_batch_tokens=LIMITS[0])
        return self.value

    @property
    def name(self):                      # read by the dtype rule
        self.arena.resize(max_batch_tokens=LIMITS[0])
        return "uint8"


def test_view_arguments_are_converted_before_the_buffer_is_read():
    """A shape element's __index__ (or a dtype's name) that shrinks the arena
    runs before the view reads the buffer's size: the view is checked
    against the size after it, never laid over memory the shrink unmapped."""
    np = pytest.importorskip("numpy")
    gpu = metrale.HostBackend()
    with reserved(gpu, limits=TOP) as a:
        big = a.buffers["hidden_states"].nbytes
        small = BufferSizes.from_config(CFG, *LIMITS[:1], *TOP[1:], env=NOENV).hidden_states
        assert small < big
        with pytest.raises(ValueError, match=f"hidden_states holds {small}"):
            a.view("hidden_states", "uint8", (_Shrinking(a, big),))
        a.resize(max_batch_tokens=TOP[0])
        v = a.view("hidden_states", _Shrinking(a, 0))
        assert v.nbytes == small == a.buffers["hidden_states"].nbytes
        assert int(np.asarray(v)[-1]) >= 0           # inside mapped memory
        del v


def test_limits_follow_the_integer_rule():
    """Int-likes with only __index__, numpy integers, and what is out of range:
    converted (accessors return exact ints) or refused naming the argument."""
    np = pytest.importorskip("numpy")

    class Index:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v

    gpu = metrale.HostBackend()
    a = BufferArena.new(CFG, Index(64), np.int64(512), Index(16), np.int32(8), gpu,
                        reserve={"max_batch_tokens": Index(512), "max_seq_len": np.int64(1024),
                                 "max_batch_size": Index(16)})
    with a:
        assert type(a.max_batch_tokens()) is int
        a.resize(np.int64(128), Index(1024))
        assert a.max_batch_tokens() == 128 and type(a.max_batch_tokens()) is int
        for kwargs, name in (({"max_batch_tokens": 1.5}, "max_batch_tokens"),
                             ({"max_seq_len": True}, "max_seq_len"),
                             ({"kv_block_size": -1}, "kv_block_size"),
                             ({"max_batch_size": 2**64}, "max_batch_size")):
            with pytest.raises((TypeError, ValueError), match=name):
                a.resize(**kwargs)
        with pytest.raises(TypeError, match="keep"):
            a.sleep(keep=5)
        with pytest.raises(TypeError, match="keep: buffer names must be str"):
            a.sleep(keep=[5])
        with pytest.raises(TypeError, match="names"):
            a.fingerprint(names=5)
        assert not a.is_sleeping()
    with pytest.raises(TypeError, match="reserve: max_seq_len"):
        BufferArena.new(CFG, *LIMITS, gpu, reserve={"max_seq_len": 2.0})


# -- failures in the middle of a reshape -----------------------------------------------------

@pytest.mark.parametrize("step", ["sleep", "shrink", "release"])
def test_a_refused_handle_release_is_kept_and_retried(step):
    """The backend refuses to release an unmapped handle: it is not forgotten
    (summary() counts it, a warning says so) and the next reshape or the
    release gives it back."""
    gpu = FaultyBackend()
    before = vm_counts(gpu)
    a = reserved(gpu, limits=LIMITS if step == "shrink" else TOP)
    if step == "shrink":
        a.resize(*TOP)                             # grown: chunks a shrink unmaps whole
    gpu.inject_fault("release_handle")
    if step == "sleep":
        with pytest.raises(MetraleError, match="HOST_INJECTED_FAULT"):
            a.sleep()
        assert a.is_sleeping() and a.summary().unreleased_handles == 1
        assert "not released" in str(a.summary())
        a.wake()                                   # retried first
        assert a.summary().unreleased_handles == 0
        a.release()
    elif step == "shrink":
        with pytest.raises(MetraleError, match="HOST_INJECTED_FAULT"):
            a.resize(*LIMITS)
        assert a.summary().unreleased_handles >= 1
        a.resize(*LIMITS)                          # the next reshape releases it
        assert a.summary().unreleased_handles == 0
        a.release()
    else:
        a.release()                                # released again at once: nothing held
        assert a.summary().unreleased_handles == 0
    assert vm_counts(gpu) == before


def test_a_handle_release_that_keeps_failing_is_reported_by_release():
    gpu = FaultyBackend()
    a = reserved(gpu, limits=TOP)
    gpu.inject_fault("release_handle", 1)
    with pytest.raises(MetraleError):
        a.sleep()                                  # one orphan
    gpu.inject_fault("release_handle", 1)          # and the retry at release fails too
    with pytest.raises(MetraleError, match="HOST_INJECTED_FAULT"):
        a.release()
    assert a.is_released() and a.summary().unreleased_handles == 1
    del a                                          # the finalizer tries once more
    import gc
    gc.collect()
    assert gpu.handle_count == 0


def test_a_growth_that_fails_after_mapping_gives_the_mapping_back():
    """A debug arena's resize whose guard refill fails after the growth was
    mapped: the limits roll back and so does the committed memory."""
    gpu = FaultyBackend()
    with BufferArena.new(CFG, *LIMITS, gpu, reserve=TOP, debug=True) as a:
        before = (a.committed_bytes(), vm_counts(gpu), a.max_batch_tokens())
        gpu.inject_fault("sync")
        with pytest.raises(MetraleError, match="HOST_INJECTED_FAULT"):
            a.resize(*TOP)
        assert (a.committed_bytes(), vm_counts(gpu), a.max_batch_tokens()) == before
        a.resize(*TOP)                             # and it works afterwards
        assert a.committed_bytes() > before[0]
