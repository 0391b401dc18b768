"""Debug arenas (docs/debug.md): guard bands, poisoned padding rows, NaN
scans, fingerprints and element types, on every available backend.

The expectations are written out here independently of the C core: the row
rule (helpers.expected_rows_length), the poison bytes, the guard pattern and
the fingerprint (py_fingerprint, from the definition in docs/debug.md)."""

import ctypes
import pickle
import struct

import numpy as np
import pytest

import metrale
from metrale import (REFERENCE, BufferArena, BufferSizes, BufferSpec, HostBackend, MetraleError,
                     OutOfMemoryError)
from metrale.catalogue import CATALOGUE, DTYPE_ITEMSIZE
from metrale.debug import SKIP_REASONS, DebugOptions, GuardDamage, NonFinite, NonFiniteScan
from metrale.sizes import BUFFER_NAMES

from helpers import COMPACT, PRESET, Mem, expected_rows_length, fill_all, live_counts, ptr_of
from reference_oracle import NAMES, ROWS, ZERO_ALL

M64 = (1 << 64) - 1
ALIGN = 256
# Poison bytes of the element types of the row-trimmed buffers (docs/debug.md).
POISON = {"bfloat16": b"\xd1\x7f", "float32": b"\xd1\x7f\xd1\x7f"}


def sizes_of(gpu, cfg=COMPACT, m=13):
    return BufferSizes.from_config(cfg, m, 256, 16, 8, target=gpu.target(), env={})


def debug_arena(gpu, cfg=COMPACT, m=13, guard=None):
    debug = True if guard is None else DebugOptions(guard_bytes=guard)
    return BufferArena.from_sizes(sizes_of(gpu, cfg, m), gpu, debug=debug)


def live_names(arena):
    """Every non-empty buffer of the arena, in its order."""
    return [n for n, size in arena.sizes().items() if size]


def live_reference_names(arena):
    """The non-empty buffers of the arena among the oracle's reference buffers."""
    return [n for n in NAMES if getattr(arena.sizes(), n)]


def guard_byte(addr):
    """The guard pattern at an address (the slab base is 256-aligned)."""
    return 0xB0 + addr % 16


def poke(gpu, addr, data):
    if isinstance(gpu, HostBackend):
        ctypes.memmove(addr, bytes(data), len(data))
    else:
        gpu.upload(addr, bytes(data))


def peek(gpu, addr, n):
    if isinstance(gpu, HostBackend):
        return ctypes.string_at(addr, n)
    return gpu.download(addr, n)


def band_of(arena, name, guard):
    """(start address, length) of the guard band after buffer `name`."""
    n = getattr(arena.sizes(), name)
    end = ptr_of(arena, name) + n
    return end, -(-end // ALIGN) * ALIGN + guard - end


def py_fingerprint(data):
    """The fingerprint of docs/debug.md, in plain Python."""
    key, mul = 0x9E3779B97F4A7C15, 0xD6E8FEB86659FD93
    n = len(data)
    padded = bytes(data) + b"\0" * (-n % 8)
    s = 0
    for i, (w,) in enumerate(struct.iter_unpack("<Q", padded)):
        x = ((w ^ ((i + 1) * key & M64)) * mul) & M64
        s = (s + (x ^ (x >> 32))) & M64
    x = s ^ (n * mul & M64)
    x ^= x >> 30
    x = x * 0xBF58476D1CE4E5B9 & M64
    x ^= x >> 27
    x = x * 0x94D049BB133111EB & M64
    return x ^ (x >> 31)


def random_fill(arena, gpu, seed=1):
    rng = np.random.default_rng(seed)
    m = Mem(arena, gpu)
    data = {}
    for name in live_names(arena):
        data[name] = rng.integers(0, 256, getattr(arena.sizes(), name), dtype=np.uint8)
        m.write(name, data[name])
    return m, data


# -- options ------------------------------------------------------------------------
def test_options():
    assert DebugOptions().guard_bytes == 4096
    assert DebugOptions(512) == DebugOptions(guard_bytes=np.int64(512))
    assert DebugOptions.coerce(True) == DebugOptions()
    assert DebugOptions.coerce(False) is None and DebugOptions.coerce(None) is None
    opts = DebugOptions(1024)
    assert DebugOptions.coerce(opts) is opts
    for bad in (0, -256, 100, 257, 2 ** 31):
        with pytest.raises(ValueError, match="guard_bytes"):
            DebugOptions(bad)
    for bad in (256.0, "256", True):
        with pytest.raises(TypeError, match="guard_bytes"):
            DebugOptions(bad)


def test_bad_debug_argument_allocates_nothing():
    gpu = HostBackend()
    with pytest.raises(TypeError, match="debug"):
        BufferArena.new(COMPACT, 4, 256, 16, 8, gpu, debug="yes")
    with pytest.raises(TypeError, match="debug"):
        BufferArena.new(COMPACT, 4, 256, 16, 8, gpu, debug=1)
    assert live_counts(gpu) == (0, 0)


# -- layout ----------------------------------------------------------------------------
def test_off_means_the_layout_of_today():
    gpu = HostBackend()
    plain = BufferArena.new(PRESET, 128, 4096, 16, 32, gpu)
    off = BufferArena.new(PRESET, 128, 4096, 16, 32, gpu, debug=False)
    for a in (plain, off):
        assert a.debug_options() is None and a.summary().guard_bytes == 0
    assert plain.slab_bytes() == off.slab_bytes()
    assert [i.offset for i in plain.buffers.values()] == [i.offset for i in off.buffers.values()]
    before = gpu.memset_count
    off.zero_all()
    off.zero_prefill_essentials()
    assert gpu.memset_count == before + 2            # still one memset each
    plain.release()
    off.release()


@pytest.mark.parametrize("guard", [256, 4096])
def test_guard_layout(guard):
    gpu = HostBackend()
    arena = debug_arena(gpu, PRESET, 128, guard)
    sizes = arena.sizes()
    live = live_names(arena)
    # every live buffer is followed by its padding and `guard` bytes, and nothing else
    assert arena.slab_bytes() == sum(-(-getattr(sizes, n) // ALIGN) * ALIGN + guard for n in live)
    spans = []
    for n in live:
        p = ptr_of(arena, n)
        assert p % ALIGN == 0, n
        start, length = band_of(arena, n, guard)
        assert length >= guard
        spans.append((p, start + length, n))
    spans.sort()
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        assert a1 <= b0, f"{an}'s band overlaps {bn}"
    assert arena.debug_options() == DebugOptions(guard)
    assert "guard band" in str(arena.summary()) and arena.summary().guard_bytes == guard
    arena.release()
    assert live_counts(gpu) == (0, 0)


def test_construction_failure_leaves_nothing():
    from metrale.testing import FaultyBackend
    gpu = FaultyBackend()
    gpu.inject_fault("alloc")
    with pytest.raises(OutOfMemoryError):
        debug_arena(gpu)
    assert live_counts(gpu) == (0, 0)
    gpu.inject_fault("sync", 2)          # the wait after the guard fill
    with pytest.raises(MetraleError):
        debug_arena(gpu)
    assert live_counts(gpu) == (0, 0)
    gpu.inject_fault("sync", 2)          # the same, reserved
    with pytest.raises(MetraleError):
        BufferArena.new(COMPACT, 13, 256, 16, 8, gpu, reserve=(64, 256, 16, 8), debug=True)
    assert live_counts(gpu) == (0, 0) and gpu.mapped_bytes == gpu.reserved_bytes == 0


# -- guard bands -----------------------------------------------------------------------
def test_guards_hold_the_pattern(backend):
    arena = debug_arena(backend, guard=512)
    for n in live_names(arena):
        start, length = band_of(arena, n, 512)
        assert peek(backend, start, length) == bytes(guard_byte(start + k) for k in range(length)), n
    assert arena.check_guards() == []
    arena.verify_guards()
    arena.release()


def test_zeroing_leaves_the_guards_alone(backend):
    arena = debug_arena(backend)
    m = fill_all(arena, backend)
    arena.poison_rows(tokens=3)
    arena.zero_prefill_essentials()
    for tokens in (0, 1, 5, 12, 13, 100):
        arena.zero_all_rows(tokens=tokens)
    arena.zero_all()
    assert arena.check_guards() == []
    # zero_all still clears the zero_all buffers whole and nothing else
    for n in live_reference_names(arena):
        data = m.read(n)
        if n in ZERO_ALL:
            assert not data.any(), n
        elif n != "norm_unit_w":
            assert (data == 0xAB).all(), n
    arena.release()


def test_one_byte_overrun_past_every_buffer_is_named(backend):
    arena = debug_arena(backend)
    names = live_names(arena)
    for n in names:
        end = ptr_of(arena, n) + getattr(arena.sizes(), n)
        poke(backend, end, b"\x00")
        assert arena.check_guards() == [GuardDamage(n, 0, 1, band_of(arena, n, 4096)[1])], n
        poke(backend, end, bytes([guard_byte(end)]))       # repaired
    assert arena.check_guards() == []
    # all at once: each reported once, in slab order, by name
    for n in names:
        poke(backend, ptr_of(arena, n) + getattr(arena.sizes(), n), b"\xff")
    damage = arena.check_guards()
    assert sorted(d.buffer for d in damage) == sorted(names)
    assert all(d.offset == 0 and d.nbytes == 1 for d in damage)
    with pytest.raises(MetraleError, match="guard band") as e:
        arena.verify_guards()
    for n in names:
        assert n in str(e.value)
    arena.release()


def test_damage_offsets_and_counts(backend):
    arena = debug_arena(backend, guard=1024)
    start, length = band_of(arena, "ssm_ba", 1024)
    # a write of 40 bytes at band offset 100, with one byte equal to the pattern
    data = bytearray(40)
    data[7] = guard_byte(start + 107)
    poke(backend, start + 100, data)
    # and the band's last byte
    poke(backend, start + length - 1, b"\x01")
    assert arena.check_guards() == [GuardDamage("ssm_ba", 100, 40, length)]
    # a write just past the band lands in the next buffer: no guard sees it
    arena.release()


def test_guards_need_a_debug_arena():
    gpu = HostBackend()
    with BufferArena.new(COMPACT, 4, 256, 16, 8, gpu) as arena:
        with pytest.raises(MetraleError, match="debug=True"):
            arena.check_guards()
        with pytest.raises(MetraleError, match="debug=True"):
            arena.verify_guards()


def test_released_arena_refuses():
    gpu = HostBackend()
    arena = debug_arena(gpu)
    arena.release()
    for call in (lambda: arena.check_guards(), lambda: arena.poison_rows(tokens=1),
                 lambda: arena.find_nonfinite(tokens=1), lambda: arena.fingerprint()):
        with pytest.raises(MetraleError, match="released"):
            call()


def test_reserved_debug_arena_keeps_its_guards():
    gpu = HostBackend()
    arena = BufferArena.new(COMPACT, 13, 256, 16, 8, gpu, reserve=(64, 256, 16, 8), debug=True)
    ptrs = {n: ptr_of(arena, n) for n in BUFFER_NAMES}
    assert arena.check_guards() == []
    for m_tokens in (64, 5, 40):
        arena.resize(max_batch_tokens=m_tokens)
        assert {n: ptr_of(arena, n) for n in BUFFER_NAMES} == ptrs
        assert arena.check_guards() == [], m_tokens
        arena.zero_all()
        arena.zero_all_rows(tokens=3)
        assert arena.check_guards() == []
        end = ptr_of(arena, "hidden_states") + arena.sizes().hidden_states
        poke(gpu, end + 5, b"\x00\x00")
        assert arena.check_guards() == [GuardDamage("hidden_states", 5, 2,
                                                    band_of(arena, "hidden_states", 4096)[1])]
    arena.sleep(keep=("hidden_states",))
    arena.wake()
    assert arena.check_guards() == []
    arena.release()
    assert live_counts(gpu) == (0, 0)
    assert gpu.mapped_bytes == gpu.reserved_bytes == 0


# -- poison and NaN scans -----------------------------------------------------------
def live_bytes_of(arena, name, tokens):
    return expected_rows_length(name, getattr(arena.sizes(), name), arena.max_batch_tokens(),
                                tokens)


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("tokens", [0, 1, 3, 12, 13, 20])
def test_poison_fills_exactly_the_padding_rows(backend, tokens, debug):
    arena = BufferArena.from_sizes(sizes_of(backend), backend, debug=debug)
    m = fill_all(arena, backend)
    arena.poison_rows(tokens=tokens)
    for n in live_reference_names(arena):
        data = m.read(n).tobytes()
        if n not in ROWS:
            assert data == b"\xab" * len(data), n
            continue
        k = live_bytes_of(arena, n, tokens)
        pat = POISON[CATALOGUE[n].dtype]
        assert data[:k] == b"\xab" * k, n
        assert data[k:] == pat * ((len(data) - k) // len(pat)), n
    arena.release()


def as_bits(data, dtype):
    """Element bits of little-endian bytes (numpy, not the C core)."""
    return np.frombuffer(data, dtype="<u2" if dtype == "bfloat16" else "<u4")


def count_nonfinite(data, dtype):
    bits = as_bits(data, dtype)
    if dtype == "bfloat16":
        exp, man = (bits & 0x7F80) == 0x7F80, bits & 0x7F
    else:
        exp, man = (bits & 0x7F800000) == 0x7F800000, bits & 0x7FFFFF
    return int((exp & (man != 0)).sum()), int((exp & (man == 0)).sum())


def test_clean_step_has_no_false_positive(backend):
    arena = debug_arena(backend)
    rng = np.random.default_rng(7)
    m = Mem(arena, backend)
    arena.zero_all()
    for tokens in (1, 5, 13):
        arena.poison_rows(tokens=tokens)
        # a "step" writes finite values into the live rows (of every buffer
        # the arena's own set trims by rows: those poison_rows poisoned)
        for n in arena.sizes().buffers.groups["rows"]:
            k = live_bytes_of(arena, n, tokens)
            data = m.read(n)
            vals = rng.standard_normal(k // 4).astype(np.float32).view(np.uint8)
            if CATALOGUE[n].dtype == "bfloat16":
                vals = (rng.standard_normal(k // 2).astype(np.float32).view(np.uint32) >> 16) \
                    .astype(np.uint16).view(np.uint8)
            data[:len(vals)] = vals
            m.write(n, data)
        assert arena.find_nonfinite(tokens=tokens) == []
        assert arena.check_guards() == []
    arena.release()


def test_padding_row_read_is_caught(backend):
    arena = debug_arena(backend)
    m = Mem(arena, backend)
    tokens, hidden = 3, COMPACT.hidden_size
    arena.zero_all()
    arena.poison_rows(tokens=tokens)
    assert arena.find_nonfinite(tokens=tokens) == []
    # "a small kernel": norm_output[0] = hidden_states[tokens] (a padding row)
    row = 2 * hidden
    hs = m.read("hidden_states")
    out = m.read("norm_output")
    out[:row] = hs[tokens * row:(tokens + 1) * row]
    m.write("norm_output", out)
    found = arena.find_nonfinite(tokens=tokens)
    assert found == [NonFinite("norm_output", hidden, 0, 0, 0)]
    # and an Inf planted in row 2 of an FP32 buffer
    gates = m.read("ssm_gates")
    row_f32 = arena.sizes().ssm_gates // 13
    gates[2 * row_f32 + 4:2 * row_f32 + 8] = np.array([np.inf], "<f4").view(np.uint8)
    m.write("ssm_gates", gates)
    found = arena.find_nonfinite(tokens=tokens)
    assert found == [NonFinite("norm_output", hidden, 0, 0, 0),
                     NonFinite("ssm_gates", 0, 1, 2 * row_f32 + 4, 2)]
    arena.release()


@pytest.mark.parametrize("tokens", [0, 1, 4, 13, 50])
def test_nonfinite_counts_match_numpy(backend, tokens):
    """Every float buffer zero_all_rows clears is scanned: the row-trimmed
    ones over their live rows, the others (logits, splitk_workspace) whole."""
    arena = debug_arena(backend)
    m, data = random_fill(arena, backend, seed=tokens)
    found = {f.buffer: f for f in arena.find_nonfinite(tokens=tokens)}
    expected = {}
    for n in ZERO_ALL:
        if CATALOGUE[n].dtype not in POISON or not len(data.get(n, ())):
            continue
        k = live_bytes_of(arena, n, tokens) if n in ROWS else len(data[n])
        nan, inf = count_nonfinite(data[n][:k].tobytes(), CATALOGUE[n].dtype)
        if nan or inf:
            expected[n] = (nan, inf)
    assert {n: (f.nan, f.inf) for n, f in found.items()} == expected
    assert {"logits", "splitk_workspace"} <= set(found), "random bytes hold some NaN"
    arena.release()


# An own set (docs/buffer-sets.md): FP32 logits, a sampler workspace cleared whole,
# and one buffer of each kind the scan cannot or must not read by default.
_OWN_SPECS = [
    BufferSpec("sampler_probs", "float32", ["max_batch_size", "vocab_size"], zero_all=True),
    BufferSpec("own_raw", None, size=1024, zero_all=True),                # untyped
    BufferSpec("own_idx", "int32", ["max_batch_tokens", 4], zero_all=True, rows="M"),
    BufferSpec("own_half", "float16", ["max_batch_size", 64], zero_all=True),
    BufferSpec("own_stale", "float32", ["max_batch_size", 64]),          # in no helper
]
OWN = REFERENCE.with_(_OWN_SPECS).replace("logits", dtype="float32", size="4*Lr*V")
_DECODED = ("bfloat16", "float32", "float8_e4m3fn")


def own_arena(gpu, m=13):
    sizes = BufferSizes.from_config(COMPACT, m, 256, 16, 8, target=gpu.target(), env={},
                                    buffers=OWN)
    return BufferArena.from_sizes(sizes, gpu, debug=True)


def expected_scan(arena, tokens, names=None):
    """(scanned, skipped) of find_nonfinite, from the specs and the oracle's row rule."""
    scanned, skipped = {}, {}
    for spec in OWN:
        n = spec.name
        if names is not None and n not in names:
            continue
        size = arena.nbytes(n)
        why = ("empty" if size == 0 else "untyped" if spec.dtype is None
               else "unsupported" if spec.dtype in ("float16", "float64", "float8_e5m2")
               else "not float" if spec.dtype not in _DECODED
               else "not cleared" if names is None and not spec.zero_all else None)
        if why:
            skipped[n] = why
        else:
            rows = spec.rows != "whole"
            scanned[n] = expected_rows_length(n, size, arena.max_batch_tokens(), tokens) \
                if rows else size
    return scanned, skipped


def plant(gpu, arena, name, offset, data):
    poke(gpu, arena.ptr(name) + offset, data)


F32_NAN, F32_INF, BF16_NAN = b"\x01\x00\xc0\x7f", b"\x00\x00\x80\x7f", b"\xc1\xff"


def test_nonfinite_scans_the_buffers_cleared_whole(backend):
    """Issue 36: a NaN in FP32 logits or in an own sampler buffer (both cleared
    whole) is found; a row-trimmed BF16 buffer is read over its live rows only;
    the buffers it cannot read are named with the reason."""
    with own_arena(backend) as arena:
        tokens, hs_row, qkv_row = 3, 2 * COMPACT.hidden_size, arena.nbytes("qkv_output") // 16
        arena.zero_all()
        arena.poison_rows(tokens=tokens)           # NaN past the live rows: not reported
        scan = arena.find_nonfinite(tokens=tokens)
        assert scan == [] and isinstance(scan, NonFiniteScan)
        assert (scan.scanned, scan.skipped) == expected_scan(arena, tokens)
        assert sorted([*scan.scanned, *scan.skipped]) == sorted(OWN.names)     # each once
        assert scan.scanned["logits"] == arena.nbytes("logits") > 0
        assert scan.scanned["hidden_states"] == tokens * hs_row
        assert set(scan.skipped.values()) <= set(SKIP_REASONS)
        assert {n: scan.skipped[n] for n in ("own_raw", "own_idx", "own_half", "own_stale",
                                             "scratch", "token_ids", "gate_logits_f32")} == {
            "own_raw": "untyped", "own_idx": "not float", "own_half": "unsupported",
            "own_stale": "not cleared", "scratch": "untyped", "token_ids": "not float",
            "gate_logits_f32": "not cleared"}
        arena.zero_all()
        last_logit = arena.nbytes("logits") - 4
        plant(backend, arena, "logits", last_logit, F32_NAN)
        plant(backend, arena, "sampler_probs", 4 * 7, F32_INF)
        plant(backend, arena, "hidden_states", 2 * hs_row + 6, BF16_NAN)            # live row 2
        plant(backend, arena, "hidden_states", 5 * hs_row, b"\x80\x7f")            # row 5: padding
        plant(backend, arena, "qkv_output", 14 * qkv_row, BF16_NAN)    # row 14 < ceil16(3): live
        plant(backend, arena, "own_stale", 0, bytes(arena.nbytes("own_stale")))   # no cleaner
        plant(backend, arena, "own_stale", 0, F32_NAN)
        plant(backend, arena, "own_half", 0, b"\x00\x7e")                          # FP16 NaN
        plant(backend, arena, "own_idx", 0, b"\xff\xff\xff\xff")
        plant(backend, arena, "own_raw", 0, b"\xff" * 16)
        want = [NonFinite("hidden_states", 1, 0, 2 * hs_row + 6, 2),
                NonFinite("qkv_output", 1, 0, 14 * qkv_row, 14),
                NonFinite("logits", 1, 0, last_logit, None),
                NonFinite("sampler_probs", 0, 1, 28, None)]
        assert arena.find_nonfinite(tokens=tokens) == want
        # tokens = 0: no live rows, the buffers cleared whole still whole
        scan = arena.find_nonfinite(tokens=0)
        assert scan == want[2:] and scan.scanned["hidden_states"] == 0
        assert (scan.scanned, scan.skipped) == expected_scan(arena, 0)
        # every row: the padding row's Inf too
        scan = arena.find_nonfinite(tokens=arena.max_batch_tokens())
        assert scan[0] == NonFinite("hidden_states", 1, 1, 2 * hs_row + 6, 2)
        assert scan.scanned["hidden_states"] == arena.nbytes("hidden_states")
        # names: exactly those, a buffer in no helper whole, in the set's order
        asked = ["own_stale", "own_half", "logits", "hidden_states"]
        scan = arena.find_nonfinite(tokens=tokens, names=asked)
        assert scan == [want[0], want[2], NonFinite("own_stale", 1, 0, 0, None)]
        assert (scan.scanned, scan.skipped) == expected_scan(arena, tokens, asked)
        assert scan.skipped == {"own_half": "unsupported"}
        assert arena.find_nonfinite(tokens=tokens, names="own_stale").scanned == \
            {"own_stale": arena.nbytes("own_stale")}


def test_nonfinite_scan_is_a_list():
    scan = NonFiniteScan([NonFinite("logits", 1, 0, 4, None)], {"logits": 8}, {"x": "untyped"})
    assert scan == [NonFinite("logits", 1, 0, 4, None)] and isinstance(scan, list)
    assert NonFiniteScan() == [] and NonFiniteScan().skipped == {}
    back = pickle.loads(pickle.dumps(scan))
    assert type(back) is NonFiniteScan and back == scan
    assert (back.scanned, back.skipped) == ({"logits": 8}, {"x": "untyped"})


def test_token_arguments():
    gpu = HostBackend()
    with debug_arena(gpu) as arena:
        for call in (arena.poison_rows, arena.find_nonfinite):
            with pytest.raises(TypeError, match="tokens"):
                call()
            with pytest.raises(TypeError, match="tokens"):
                call(tokens=1.0)
            with pytest.raises(ValueError, match="tokens"):
                call(tokens=-1)
        with pytest.raises(ValueError, match="names"):
            arena.find_nonfinite(tokens=1, names=["logits", "no_such_buffer"])
        with pytest.raises(TypeError, match="names"):
            arena.find_nonfinite(tokens=1, names=[1])


# -- fingerprints ------------------------------------------------------------------------
def test_fingerprint_matches_plain_python(backend):
    arena = debug_arena(backend)
    _, data = random_fill(arena, backend)
    fp = arena.fingerprint()
    assert list(fp) == live_names(arena)
    for n in live_names(arena):
        assert fp[n] == py_fingerprint(data[n].tobytes()), n
    arena.release()


def test_fingerprint_names_and_changes(backend):
    arena = debug_arena(backend)
    m, data = random_fill(arena, backend)
    fp = arena.fingerprint(names=["logits", "hidden_states", "logits", "lora_xa"])
    assert list(fp) == ["logits", "hidden_states", "lora_xa"]
    assert fp["lora_xa"] == py_fingerprint(b"")                 # an empty buffer
    assert arena.fingerprint(names="moe_fp8_scratch") == {
        "moe_fp8_scratch": py_fingerprint(data["moe_fp8_scratch"].tobytes())}
    base = arena.fingerprint(names=["hidden_states"])["hidden_states"]
    changed = data["hidden_states"].copy()
    changed[1000] ^= 1
    m.write("hidden_states", changed)
    assert arena.fingerprint(names=["hidden_states"])["hidden_states"] != base
    swapped = data["hidden_states"].copy()
    swapped[:8], swapped[8:16] = data["hidden_states"][8:16], data["hidden_states"][:8]
    m.write("hidden_states", swapped)
    assert arena.fingerprint(names=["hidden_states"])["hidden_states"] != base
    m.write("hidden_states", data["hidden_states"])
    assert arena.fingerprint(names=["hidden_states"])["hidden_states"] == base
    with pytest.raises(ValueError, match="names"):
        arena.fingerprint(names=["no_such_buffer"])
    with pytest.raises(TypeError, match="names"):
        arena.fingerprint(names=[1])
    arena.release()


def test_fingerprint_without_debug_mode():
    gpu = HostBackend()
    with BufferArena.from_sizes(sizes_of(gpu), gpu) as arena:
        _, data = random_fill(arena, gpu)
        assert arena.fingerprint(names=ZERO_ALL) == {
            n: py_fingerprint(data[n].tobytes()) for n in ZERO_ALL}


def test_fingerprint_edge_lengths():
    """Trailing partial words: every length 0 .. 40 of one buffer."""
    gpu = HostBackend()
    zero = BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0))
    rng = np.random.default_rng(3)
    for n in range(41):
        with BufferArena.from_sizes(COMPACT, zero.replace(o_latent=n), 1, 0, gpu,
                                    debug=True) as arena:
            data = rng.integers(0, 256, n, dtype=np.uint8)
            if n:
                np.asarray(arena.view("o_latent", "uint8"))[:] = data
                assert arena.check_guards() == []
            assert arena.fingerprint(names="o_latent")["o_latent"] == py_fingerprint(data.tobytes())


# -- element types -----------------------------------------------------------------------
def test_element_types_on_the_buffer_mapping():
    from metrale._arena._debug import _CODES
    assert set(DTYPE_ITEMSIZE) <= set(_CODES)            # every catalogue type has a code
    gpu = HostBackend()
    with debug_arena(gpu) as arena:
        for n in BUFFER_NAMES:
            assert arena.buffers[n].dtype == CATALOGUE[n].dtype, n
        for n in ROWS:                                     # poisoned and scanned: floats
            assert arena.buffers[n].dtype in POISON, n
    assert metrale.DebugOptions is DebugOptions


# -- GPU only (the gpu fixture): the kernels against the host's C, torch kernels, graphs --
def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


@pytest.mark.parametrize("cfg,m", [(COMPACT, 13), (PRESET, 100)])
def test_gpu_and_host_agree_byte_for_byte(gpu, cfg, m):
    """The same bytes in a CUDA arena and a host arena of the same sizes give
    the same fingerprints (more than one block per buffer at PRESET, M = 100),
    NaN counts and guard reports."""
    host = HostBackend()
    sizes = BufferSizes.from_config(cfg, m, 256, 16, 8, env={})
    arenas = [BufferArena.from_sizes(sizes, g, debug=True) for g in (gpu, host)]
    rng = np.random.default_rng(11)
    for name in live_names(arenas[0]):
        data = rng.integers(0, 256, getattr(sizes, name), dtype=np.uint8)
        for arena, g in zip(arenas, (gpu, host)):
            Mem(arena, g).write(name, data)
    assert arenas[0].fingerprint() == arenas[1].fingerprint()
    for tokens in (0, 1, 7, m, m + 5):
        scans = [a.find_nonfinite(tokens=tokens) for a in arenas]
        assert scans[0] == scans[1] and any(f.buffer == "logits" for f in scans[0])
        assert (scans[0].scanned, scans[0].skipped) == (scans[1].scanned, scans[1].skipped)
    for arena, g in zip(arenas, (gpu, host)):
        arena.poison_rows(tokens=2)
        for name in ("residual", "logits", "moe_fp8_scratch"):
            end = ptr_of(arena, name) + getattr(sizes, name)
            poke(g, end + 3, b"\x00" * 5)
    gpu.synchronize()
    assert arenas[0].check_guards() == arenas[1].check_guards() != []
    assert arenas[0].fingerprint() == arenas[1].fingerprint()
    assert arenas[0].find_nonfinite(tokens=2) == arenas[1].find_nonfinite(tokens=2)
    for arena in arenas:
        arena.release()


def test_torch_kernel_reading_a_padding_row(gpu):
    torch = _torch()
    tokens, hidden = 3, PRESET.hidden_size
    with BufferArena.new(PRESET, 64, 4096, 16, 32, gpu, debug=True) as arena:
        s = torch.cuda.current_stream()
        arena.zero_all(stream=s)
        arena.poison_rows(stream=s, tokens=tokens)
        hs = torch.from_dlpack(arena.view("hidden_states", torch.bfloat16, (64, hidden)))
        out = torch.from_dlpack(arena.view("norm_output", torch.bfloat16,
                                           (64, arena.sizes().norm_output // 128)))
        hs[:tokens].normal_()
        out[:tokens, :hidden] = hs[:tokens] * 2            # a clean step
        assert arena.find_nonfinite(stream=s, tokens=tokens) == []
        out[1, :hidden] = hs[1:tokens + 1].sum(dim=0)     # reads padding row `tokens`
        found = arena.find_nonfinite(stream=s, tokens=tokens)
        assert [(f.buffer, f.nan, f.first_row) for f in found] == [("norm_output", hidden, 1)]
        assert arena.check_guards(stream=s) == []
        del hs, out


def test_poison_rows_in_a_cuda_graph(gpu):
    torch = _torch()
    m_tokens, tokens = 100, 17
    with BufferArena.new(PRESET, m_tokens, 4096, 16, 32, gpu, debug=True) as arena:
        stream = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=stream):
            s = torch.cuda.current_stream()
            arena.zero_all_rows(stream=s, tokens=tokens)
            arena.poison_rows(stream=s, tokens=tokens)
        m = fill_all(arena, gpu)
        g.replay()
        torch.cuda.synchronize()
        for n in ROWS:
            data = m.read(n).tobytes()
            k = expected_rows_length(n, getattr(arena.sizes(), n), m_tokens, tokens)
            pat = POISON[CATALOGUE[n].dtype]
            assert data[:k] == bytes(k) and data[k:] == pat * ((len(data) - k) // len(pat)), n
        assert arena.check_guards() == []
        del g
