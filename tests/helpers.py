"""Helpers shared by the test modules (imported as `helpers`; conftest.py
holds only fixtures and settings)."""

import ctypes
import threading

import metrale
from metrale import BufferArena, BufferSet, BufferSizes, BufferSpec, ModelConfig

from reference_oracle import NAMES, NO_POINTER, PREFILL, ROW_RULES, ROWS, STEP, ZERO_ALL

PRESET = ModelConfig.preset("qwen3-next-80b")
NOENV = {}
COMPACT = PRESET.replace(hidden_size=512, num_hidden_layers=4, linear_num_key_heads=4,
                         linear_key_head_dim=64, linear_num_value_heads=8, linear_value_head_dim=64)


# -- the buffer-set tests' small Llama and engine specs (test_buffer_spec.py,
# test_buffer_set.py, test_buffer_set_files.py, test_custom_sets.py) ------------------

# A small Llama: every size below is a few KiB to a few MiB.
CFG = ModelConfig.preset("llama-3.1-8b").replace(
    hidden_size=256, intermediate_size=512, vocab_size=1000, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64)
H, V, HQ, D = 256, 1000, 4, 64
LIMITS = (50, 256, 16, 8)           # max_batch_tokens, max_seq_len, kv_block_size, max_batch_size
M, BS = LIMITS[0], LIMITS[3]

SAMPLER = BufferSpec("sampler_probs", "float32", ["max_batch_size", "vocab_size"])
LSE = BufferSpec("splitkv_lse", "float32", ["max_batch_size", "num_attention_heads", 16],
                 zero_all=True)
STAGING = BufferSpec("allreduce_staging", "bfloat16", ["max_batch_tokens", "hidden_size"],
                     zero_all=True, rows="M", align=4096)


def _ceil(x, n):
    return -(-x // n) * n


def _sized(*specs, m=M, config=CFG):
    return BufferSizes.from_config(config, m, *LIMITS[1:], env=NOENV, buffers=BufferSet(specs))


def _host_bytes(ptr, n):
    """A writable numpy array over n bytes of this process at address ptr."""
    import numpy as np
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))


# -- fit (test_fit.py, test_fit_sets.py) ----------------------------------------------------

LLAMA = ModelConfig.preset("llama-3.1-8b")
FIT_LIMITS = (4096, 16, 32)         # max_seq_len, kv_block_size, max_batch_size
GIB = 2**30


def sizes_at(cfg, m, lim=FIT_LIMITS, env=NOENV, tp=1, target=None):
    return BufferSizes.from_config(cfg, m, *lim, env=env, tp_size=tp, target=target)


def run(capsys, *argv):
    """`metrale` with argv: (exit status, stdout, stderr)."""
    from metrale.cli import main
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


# -- reserved arenas of the lifetime tests (test_release.py, test_collector.py) ------------

RESERVE = (512, 1024, 16, 16)


def _reserved(gpu):
    """An arena of COMPACT at max_batch_tokens 64, reserved at RESERVE."""
    return BufferArena.new(COMPACT, 64, 512, 16, 8, gpu, reserve=RESERVE)


def new(gpu, cfg=PRESET, m=128, seq=4096, blk=16, bs=32, env=NOENV):
    s = BufferSizes.from_config(cfg, m, seq, blk, bs, target=gpu.target(), env=env)
    return BufferArena.from_sizes(s, gpu)


def package_modules():
    """Every importable module of metrale, each once (a public path such as
    metrale.sizes is the module of its layer, metrale._sizing.sizes), the
    package first; __main__ (it runs the command line) and modules whose
    imports are missing here (metrale._backends._cuda without cuda-bindings)
    left out."""
    import importlib
    import pkgutil
    mods, seen = [metrale], {id(metrale)}
    for info in pkgutil.walk_packages(metrale.__path__, "metrale.", onerror=lambda name: None):
        if info.name == "metrale.__main__":
            continue
        try:
            mod = importlib.import_module(info.name)
        except ImportError:
            continue
        if id(mod) not in seen:
            seen.add(id(mod))
            mods.append(mod)
    return mods


def rows_live(rule, n, m, tokens):
    """Bytes from its start that zero_all_rows(tokens) clears of an n-byte
    zero_all buffer with row rule `rule` (docs/buffer-sets.md), written out
    again independently of the C core: "M" tokens rows of n / m when m
    divides n, "Mp" min(ceil16(tokens), m16) rows of n / m16 when m16 =
    ceil16(m) divides n, "M|Mp" (and the deprecated "auto") the larger of
    those two with the rows rounded up, at most n; n otherwise."""
    m = max(m, 1)
    if rule == "whole" or tokens >= m:
        return n
    m16 = -(-m // 16) * 16
    t16 = min(-(-tokens // 16) * 16, m16)
    if rule in ("M|Mp", "auto"):
        return min(n, max(-(-n // m) * tokens, -(-n // m16) * t16))
    if rule == "M" and n % m == 0:
        return n // m * tokens
    if rule == "Mp" and n % m16 == 0:
        return n // m16 * t16
    return n


def expected_rows_length(name, n, m, tokens):
    """rows_live of reference buffer `name` by the oracle's row rule."""
    return rows_live(ROW_RULES[name], n, m, tokens)


# The markers of the tests that need devices (registered in pyproject.toml,
# applied and checked by conftest.py).
DEVICE_MARKERS = {
    "gpu": "needs one CUDA device (skipped without one; pytest -m gpu runs these)",
    "two_gpus": "needs two CUDA devices (skipped without them; pytest -m two_gpus)",
}

_reason = None
_backend = None
_devices = None


def cuda_backend():
    """The shared CudaBackend(0), or None where none can be made (see
    cuda_reason()).  Tests get it through the gpu and backend fixtures."""
    global _reason, _backend
    if _backend is None and _reason is None:
        try:
            _backend = metrale.CudaBackend(0)
        except metrale.MetraleError as e:
            _reason = f"no CUDA backend here: {e}"
    return _backend


def cuda_reason():
    return _reason


def cuda_device_count():
    """CUDA devices the driver sees, 0 where there is no driver (asked once)."""
    global _devices
    if _devices is None:
        _devices = 0
        try:
            from cuda.bindings import driver
            if driver.cuInit(0)[0] == driver.CUresult.CUDA_SUCCESS:
                err, n = driver.cuDeviceGetCount()
                _devices = n if err == driver.CUresult.CUDA_SUCCESS else 0
        except Exception:
            pass
    return _devices


def live_counts(gpu):
    """(live allocations, live bytes) as the backend reports them."""
    return gpu.live_alloc_count, gpu.live_bytes


def vm_counts(gpu):
    """(reserved bytes, mapped bytes, physical handles) the backend holds now
    (reserved arenas)."""
    return gpu.reserved_bytes, gpu.mapped_bytes, gpu.handle_count


def statm_resident():
    """Resident memory of this process in bytes (/proc/self/statm)."""
    import os
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGESIZE")


def resident_in(lo, hi):
    """Resident bytes of this process's pages in [lo, hi), every page of
    which must be mapped (mincore(2), page by page): what the memory at those
    addresses holds, whatever the rest of the process (or a sanitizer's
    allocator) does.  /proc/self/smaps would not do: the kernel merges
    adjacent anonymous mappings, so a mapping's Rss is not the range's."""
    import ctypes
    import os
    page = os.sysconf("SC_PAGESIZE")
    lo, hi = lo // page * page, -(-hi // page) * page
    n = (hi - lo) // page
    vec = (ctypes.c_ubyte * n)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    if libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), vec) != 0:
        raise OSError(ctypes.get_errno(), f"mincore of [{lo:#x}, {hi:#x})")
    return sum(b & 1 for b in vec) * page


class Mem:
    """Read and write arena buffers as bytes on either backend (host: numpy;
    CUDA: the backend's own copies), for sentinel tests."""

    def __init__(self, arena, gpu):
        self.arena, self.gpu = arena, gpu

    def fill(self, name, value):
        import numpy as np
        n = getattr(self.arena.sizes(), name)
        if n:
            self.write(name, np.full(n, value, dtype=np.uint8))

    def write(self, name, data):
        """Write the uint8 array `data` over the whole of buffer `name`."""
        import numpy as np
        if isinstance(self.gpu, metrale.HostBackend):
            np.asarray(self.arena.view(name, "uint8", len(data)))[:] = data
        else:
            self.gpu.upload(ptr_of(self.arena, name), data.tobytes())

    def read(self, name):
        import numpy as np
        n = getattr(self.arena.sizes(), name)
        if n == 0:
            return np.zeros(0, dtype=np.uint8)
        if isinstance(self.gpu, metrale.HostBackend):
            return np.asarray(self.arena.view(name, "uint8", n)).copy()
        # a writable copy on either backend, as the host branch gives
        return np.frombuffer(self.gpu.download(ptr_of(self.arena, name), n), dtype=np.uint8).copy()


# The slab order the layout's contract describes (src/arena_core.h): the step
# inputs zero_all does not cover, then the others (scratch), then the
# zero_prefill_essentials buffers, the other row-trimmed ones, the rest of
# zero_all, everything else; each part in canonical order.  Written out here
# from the contract and the groups of tests/reference_oracle.py, apart from the
# C core, as the oracle of the arena's bytes.

def _slab_part(name):
    if name in STEP:
        return 0 if name not in ZERO_ALL else 1
    for part, group in ((2, PREFILL), (3, ROWS), (4, ZERO_ALL)):
        if name in group:
            return part
    return 5


def _slab_key(name):
    # a buffer the oracle does not list (tests/test_buffers.py fails on it) counts
    # among "everything else", after the listed ones
    return _slab_part(name), NAMES.index(name) if name in NAMES else len(NAMES)


SLAB_ORDER = tuple(sorted(NAMES, key=_slab_key))


# The step inputs' parts: each ends 256 bytes on (the next follows at once)
# and keeps its whole room mapped; every other part's buffers end on a granule.
TIGHT_PARTS = (0, 1)


def spec_part(spec):
    """The slab part of any buffer set's spec (docs/buffer-sets.md, written
    out apart from the C core): the step inputs (the token ids, the other
    roles, the reference's decode metadata), the prefill buffers, the other
    row-trimmed ones, the rest of zero_all, everything else."""
    if spec.step:
        return {"token_ids": 0, "decode_meta": 2}.get(spec.step, 1)
    if spec.prefill:
        return 3
    if spec.rows != "whole":
        return 4
    return 5 if spec.zero_all else 6


def arena_bytes(sizes, guard=0, granularity=None):
    """The device bytes of an arena of `sizes`, from the layout's contract.

    A plain arena: each live buffer at the running end, which then moves to
    the next 256-byte boundary plus `guard` (the debug band).  A reserved
    arena reserved at its own limits (granularity given): each live buffer's
    sub-range (its bytes, or with a guard its bytes up to 256 plus the
    guard) ends on a granule, token_ids' on the next 256 bytes (scratch
    shares its granule); every granule of it is mapped."""
    cur = 0
    for name in sorted(sizes, key=_slab_key):
        n = sizes[name]
        if n == 0:
            continue
        if granularity is None:
            cur = -(-(cur + n) // 256) * 256 + guard
        else:
            span = n if not guard else -(-n // 256) * 256 + guard
            unit = 256 if _slab_part(name) == 0 else granularity
            cur = -(-(cur + span) // unit) * unit
    return cur


def needed_bytes(a, gran, guard=0):
    """The bytes a reserved arena's current limits need mapped, written out
    from the layout: every granule a live buffer touches, counted once.  A
    buffer touches [offset, offset + span): span its size, or on a debug
    arena its size up to the next 256 bytes plus the guard band; token_ids
    runs up to scratch (a step's upload spans both, padding included, and
    the two may share a granule)."""
    sizes = a.sizes()
    granules = set()
    for n in NAMES:
        size = getattr(sizes, n)
        if not size:
            continue
        start = a.buffers[n].offset
        if n == "token_ids":
            end = a.buffers["scratch"].offset
        else:
            end = start + (size if not guard else -(-size // 256) * 256 + guard)
        granules.update(range(start // gran, -(-end // gran)))
    return len(granules) * gran


def ptr_of(arena, name):
    """The pointer of any reference buffer (the two without an accessor via a
    view), or of any buffer of an own set (`ptr`)."""
    if name in NO_POINTER:
        return arena.view(name, "uint8").ptr if getattr(arena.sizes(), name) else 0
    if not hasattr(type(arena), name):
        return arena.ptr(name)
    return getattr(arena, name)()


def slab_base(arena):
    """Where the slab starts: its lowest buffer (the layout puts one at offset 0)."""
    return min(p for p in (ptr_of(arena, n) for n in NAMES) if p)


def fill_all(arena, gpu, value=0xAB):
    m = Mem(arena, gpu)
    for name in NAMES:
        m.fill(name, value)
    return m


def rows_expectation(sizes, m_tokens, tokens):
    """name -> bytes zero_all_rows(tokens) must clear: the zero_all buffers
    whole, the token-major ones (ROWS) trimmed by expected_rows_length."""
    expect = {n: getattr(sizes, n) for n in ZERO_ALL}
    for n in ROWS:
        expect[n] = expected_rows_length(n, getattr(sizes, n), m_tokens, tokens)
    return expect


def check_zeroed(arena, m, expect, spared=(), got=None):
    """`expect`: name -> bytes from the start that must now be zero; every other
    byte of every buffer must still hold the sentinel.  `spared`: (name, start,
    end) byte ranges the caller checks instead; `got`: name -> bytes already
    read (else read through the Mem `m`).  Every reference buffer of the oracle
    is checked."""
    sizes = arena.sizes()
    for name in NAMES:
        n = getattr(sizes, name)
        if n == 0:
            continue
        data = m.read(name) if got is None else got[name]
        k = expect.get(name, 0)
        for sname, lo, hi in spared:
            if sname == name:
                data = data.copy()
                data[lo:hi] = 0 if lo < k else 0xAB
        if name == "norm_unit_w" and k == 0:
            assert (data == 0xAB).all(), name   # only construction zero-fills it
            continue
        assert not data[:k].any(), f"{name}: first {k} bytes not zeroed"
        assert (data[k:] == 0xAB).all(), f"{name}: bytes past {k} were written"


def in_thread(fn, *args):
    out = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as e:     # re-raised in the caller
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


def check_placement(arena, gpu):
    """ARENA.md §8.3: non-NULL entries 256-aligned, disjoint, inside the slab,
    whose size lies between the sum of the sizes and the sum of their ceil256."""
    sizes = arena.sizes()
    spans = []
    for name in sizes:              # every buffer the arena holds
        n, p = getattr(sizes, name), ptr_of(arena, name)
        if n:
            assert p % 256 == 0, name
            spans.append((p, p + n, name))
    spans.sort()
    if not spans:
        assert arena.slab_bytes() == 0
        return
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        assert a1 <= b0, f"{an} overlaps {bn}"
    lo, hi = spans[0][0], spans[-1][1]
    assert hi - lo <= arena.slab_bytes()
    total = sum(sizes.as_dict().values())
    ceil_total = sum(-(-v // 256) * 256 for v in sizes.as_dict().values())
    assert total <= arena.slab_bytes() <= ceil_total


class HookStream:
    """A stream whose protocol method runs `hook` (inside the operation that
    reads the stream) and then names stream 0."""

    def __init__(self, hook):
        self.hook = hook

    def __cuda_stream__(self):
        self.hook()
        return (0, 0)


class ProtoStream:
    """A stream of the CUDA stream protocol: __cuda_stream__() returns `result`."""

    def __init__(self, result=(0, 0)):
        self.result = result

    def __cuda_stream__(self):
        return self.result


class AttrStream:
    """A stream object by attribute: cuda_stream (torch) or ptr (CuPy)."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)


class FileGroup:
    """A process group for tests: `all_gather_object` through files in a
    directory every rank shares (each round: write mine, wait for all).

    `timeouts` maps a round number to its timeout (default `timeout`), so a
    test can make one round fail fast; `die_after` ends the process (as a
    crash would) right after that round; `skip` makes a round return
    without writing (a rank that never calls)."""

    def __init__(self, path, rank, size, timeout=60.0, timeouts=None, die_after=None):
        self.path, self._rank, self._size = str(path), rank, size
        self.timeout, self.timeouts, self.die_after = timeout, timeouts or {}, die_after
        self.round = 0

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def all_gather_object(self, object_list, obj):
        import os
        import pickle
        import time
        k = self.round
        self.round += 1
        mine = os.path.join(self.path, f"{k}.{self._rank}")
        with open(mine + ".tmp", "wb") as f:
            pickle.dump(obj, f)
        os.replace(mine + ".tmp", mine)
        deadline = time.monotonic() + self.timeouts.get(k, self.timeout)
        names = [os.path.join(self.path, f"{k}.{r}") for r in range(self._size)]
        while not all(os.path.exists(n) for n in names):
            if time.monotonic() > deadline:
                missing = [r for r, n in enumerate(names) if not os.path.exists(n)]
                raise TimeoutError(f"round {k}: rank(s) {missing} did not arrive")
            time.sleep(0.002)
        for r, n in enumerate(names):
            with open(n, "rb") as f:
                object_list[r] = pickle.load(f)
        if self.die_after == k:
            os._exit(3)


def run_ranks(fn, size=2, timeout=120.0, args=(), dead=()):
    """Run fn(rank, size, *args) in `size` fresh processes (spawn); return
    their results in rank order (None for the ranks in `dead`, which are
    expected to exit without one).  A rank that raises, exits or outlives
    `timeout` makes this raise AssertionError naming it."""
    import multiprocessing
    import queue
    import time
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(q, fn, r, size, args), daemon=True)
             for r in range(size)]
    for p in procs:
        p.start()
    results, deadline = {}, time.monotonic() + timeout
    try:
        while len(results) < size - len(dead):
            try:
                r, ok, value = q.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in results and not p.is_alive()]
                raise AssertionError(f"ranks {sorted(set(range(size)) - set(results))} gave no "
                                     f"result within {timeout} s (exited: {dead})") from None
            if not ok:
                raise AssertionError(f"rank {r} raised:\n{value}")
            results[r] = value
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
        q.close()
    return [results.get(r) for r in range(size)]


def _rank_main(q, fn, rank, size, args):
    import traceback
    try:
        value = fn(rank, size, *args)
    except BaseException:
        q.put((rank, False, traceback.format_exc()))
    else:
        q.put((rank, True, value))


def under_asan():
    """Whether AddressSanitizer is preloaded (.ci/run's sanitizer stage)."""
    import os
    return "libasan" in os.environ.get("LD_PRELOAD", "")


def process_resources():
    """(open descriptors, address-space reservations, memfd mappings) of this
    process, from /proc.

    A reservation is what a host arena reserves: an anonymous PROT_NONE
    mapping of at least 1 MiB (the interpreter's own mappings, which come and
    go with its allocator, are read-write, and thread-stack guards are one
    page).  Not the tail of a heap glibc's malloc makes for a thread: a
    64 MiB-aligned block of 64 MiB, read-write up to where it has grown, then
    PROT_NONE (a thread of an earlier test allocating for the first time
    makes one, at any moment).  Under AddressSanitizer (.ci/run preloads it)
    the sanitizer keeps PROT_NONE shadow regions of its own, so they are
    reported as 0 there; descriptors and metrale's memfd mappings still count."""
    import os
    fds = len(os.listdir("/proc/self/fd"))
    with open("/proc/self/maps") as f:
        maps = f.read().splitlines()
    reserved = 0
    if not under_asan():
        heap = 64 << 20                 # glibc's HEAP_MAX_SIZE on 64-bit
        prev = None
        for line in maps:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            anon = len(parts) < 6
            if parts[1] == "---p" and anon and hi - lo >= 1 << 20:
                thread_heap = prev is not None and prev[1] == lo and prev[2] and \
                    prev[0] % heap == 0 and hi - prev[0] == heap
                reserved += not thread_heap
            prev = (lo, hi, parts[1] == "rw-p" and anon)
    return fds, reserved, sum("memfd:metrale" in m for m in maps)


def run_watched(fn, *args, timeout=60.0):
    """fn(*args) in a fresh process (spawn), under a watchdog: a hang fails
    the test after `timeout` seconds (AssertionError) instead of blocking the
    run; returns fn's result, re-raises its failure as AssertionError."""
    return run_ranks(_watched, 1, timeout, (fn,) + args)[0]


def _watched(rank, size, fn, *args):
    return fn(*args)


class Cycle:
    """An object in a reference cycle (it refers to itself) that holds what it
    is given: collected only by the cyclic collector, which may clear
    anything reachable from it in any order."""

    def __init__(self, **held):
        self.__dict__.update(held)
        self.me = self


class OneRank:
    """A group of one rank, for shared arenas in a single process."""

    def rank(self):
        return 0

    def size(self):
        return 1

    def all_gather_object(self, out, obj):
        out[0] = obj


def blocked_operation(gpu, arena, kind="memset"):
    """Start arena.zero_all() on a thread and hold it inside its backend call
    of `kind` (a FaultyBackend) until the returned event is set: an operation
    in flight for as long as a test needs.  Returns (thread, event)."""
    inside, go = threading.Event(), threading.Event()

    def hook():
        inside.set()
        go.wait(60)

    gpu.inject_call(kind, hook)
    t = threading.Thread(target=arena.zero_all)
    t.start()
    assert inside.wait(60), "the operation never started"
    return t, go


# -- peer_all_reduce's expectation, written out (test_allreduce*.py) ------------------

def bf16_values(bits):
    """bfloat16 bit patterns (uint16) as float64, exactly."""
    import numpy as np
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def round_bf16(x):
    """Float64 values (finite, normal range) to the nearest bfloat16, ties to
    even, as bit patterns: the 8 significant bits of x = m * 2**e."""
    import numpy as np
    x = np.asarray(x, dtype=np.float64)
    _, e = np.frexp(x)
    step = np.ldexp(1.0, e - 8)
    y = np.round(x / step) * step          # numpy rounds halves to even
    return (y.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def rank_input(rank, name, rows, width, dtype):
    """Rank `rank`'s rows of `name`: bfloat16 bit patterns (uint16) or float32."""
    import numpy as np
    rng = np.random.default_rng([rank, sum(map(ord, name))])
    v = rng.normal(0.0, 4.0, size=(rows, width)).astype(np.float32)
    if dtype == "bfloat16":
        return (v.view(np.uint32) >> 16).astype(np.uint16)      # any bfloat16 will do
    return v


def expected_sum(inputs, dtype):
    """The reduction of each rank's rows, in rank order."""
    import numpy as np
    if dtype == "bfloat16":
        acc = bf16_values(inputs[0]).astype(np.float32)
        for x in inputs[1:]:
            acc = acc + bf16_values(x).astype(np.float32)          # float32 adds
        return round_bf16(acc.astype(np.float64))
    acc = inputs[0].copy()
    for x in inputs[1:]:
        acc = acc + x
    return acc


# -- safetensors files, written by the format's description (not by metrale):
# an 8-byte little-endian header length, a JSON header of name -> {dtype, shape,
# data_offsets relative to the end of the header}, padded with spaces to a
# multiple of 8, then the tensors' bytes back to back ---------------------------------

def write_safetensors(path, tensors, metadata=None, pad=8):
    """Write [(name, safetensors dtype, shape, bytes)] in that order; returns path."""
    import json
    import struct
    header, at = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(data)]}
        at += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % pad)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for *_, data in tensors:
            f.write(data)
    return path
