"""Arenas over buffer sets that are not REFERENCE (issue 23,
docs/buffer-sets.md): plain, reserved, debug and shared between ranks, they
hold exactly the buffers their set declares, with the spec's sizes, element
types and shapes, and the set is part of the layout the ranks agree on.

Every expected value here is written out from the docs (sizes as products of
the config's fields, poison patterns, offsets from the placement rule), not
read back from the code under test.  The layout and zeroing properties over
random sets are in tests/test_buffer_set_properties.py."""

import pickle

import pytest

from metrale import (REFERENCE, BufferArena, BufferSet, BufferSizes, BufferSpec, HostBackend,
                     MetraleError, ModelConfig)

from helpers import (BS, CFG, H, HQ, LIMITS, LSE, M, NOENV, SAMPLER, STAGING, V, FileGroup, _ceil,
                     _host_bytes, live_counts, run_ranks, vm_counts)
from reference_oracle import BYTES, POINTER

np = pytest.importorskip("numpy")


# -- arenas over custom sets (HostBackend) -----------------------------------------------------

STEP_SPECS = (REFERENCE["token_ids"], REFERENCE["scratch"])
CUSTOM = BufferSet([
    STAGING,                                                            # rows "M", align 4096
    BufferSpec("tiled", "bfloat16", ["Mp", "hidden_size"], zero_all=True, rows="Mp", prefill=True),
    BufferSpec("rows_m3", "float32", ["M", 3], zero_all=True, rows="M", checksum=True),
    SAMPLER,                                                            # not zeroed
    LSE,                                                                # zeroed whole
    BufferSpec("flags", "int32", [7], init_zero=True),
    BufferSpec("raw", size="M * 3 + 5", zero_all=True, rows="M"),       # rows do not divide
    BufferSpec("nothing", "float32", ["M", "E"]),                       # E = 0: empty
    BufferSpec("idx", "int32", ["M", 2], zero_all=True, rows="M"),
])
# Each size, written out from the config: product of the dims times the element size.
CUSTOM_SIZES = {"allreduce_staging": 2 * M * H, "tiled": 2 * _ceil(M, 16) * H,
                "rows_m3": 4 * M * 3, "sampler_probs": 4 * BS * V,
                "splitkv_lse": 4 * BS * HQ * 16,
                "flags": 28, "raw": 3 * M + 5, "nothing": 0, "idx": 8 * M}


def _new(buffers=CUSTOM, gpu=None, limits=LIMITS, **kw):
    return BufferArena.new(CFG, *limits, gpu or HostBackend(), env=NOENV, buffers=buffers, **kw)


def test_sizes_of_a_custom_set_are_its_specs():
    sizes = BufferSizes.from_config(CFG, *LIMITS, env=NOENV, buffers=CUSTOM)
    assert sizes.as_dict() == CUSTOM_SIZES and sizes.buffers is CUSTOM
    assert tuple(sizes) == CUSTOM.names and sizes.sampler_probs == 4 * BS * V
    assert sizes.total_bytes() == sum(CUSTOM_SIZES.values())
    with pytest.raises(AttributeError, match="no buffer of that name"):
        sizes.hidden_states
    assert "hidden_states" not in sizes
    # by hand: every entry of the set, nothing else
    by_hand = BufferSizes(CUSTOM, **CUSTOM_SIZES)
    assert by_hand.as_dict() == sizes.as_dict() and by_hand.limits is None
    with pytest.raises(TypeError, match="missing entries: raw"):
        BufferSizes(CUSTOM, **{k: v for k, v in CUSTOM_SIZES.items() if k != "raw"})
    with pytest.raises(TypeError, match="no entry 'hidden_states'"):
        BufferSizes(CUSTOM, hidden_states=1, **CUSTOM_SIZES)
    with pytest.raises(ValueError, match="size of raw"):
        BufferSizes(CUSTOM, **{**CUSTOM_SIZES, "raw": -1})


def test_every_buffer_by_name_and_the_pointer_table():
    gpu = HostBackend()
    with _new(gpu=gpu) as a:
        ptrs = a.ptrs
        assert tuple(n for n, _ in ptrs) == CUSTOM.names
        seen = []
        for name in CUSTOM.names:
            p, n = a.ptr(name), a.nbytes(name)
            assert n == CUSTOM_SIZES[name], name
            assert getattr(ptrs, name) == p == a.buffers[name].ptr, name
            assert a.buffers[name].nbytes == n and a.buffers[name].dtype == CUSTOM[name].dtype
            if n == 0:
                assert p == 0, name
                continue
            assert p % CUSTOM[name].align == 0, name
            seen.append((p, p + n, name))
        seen.sort()
        for (_, end, x), (start, _, y) in zip(seen, seen[1:]):
            assert end <= start, (x, y)
        base = min(s for s, _, _ in seen)
        # the slab holds room to move its base up to the set's largest
        # alignment (4096 here), counted in slab_bytes and allocated
        assert max(e for _, e, _ in seen) - base <= a.slab_bytes() - (4096 - 256)
        assert gpu.live_bytes == a.slab_bytes()
        for bad in ("hidden_states", "nothin", ""):
            with pytest.raises(ValueError, match="name: unknown buffer name"):
                a.ptr(bad)
            with pytest.raises(ValueError, match="name: unknown buffer name"):
                a.nbytes(bad)
        for bad in (3, None, b"raw"):
            with pytest.raises(TypeError, match="name must be a str"):
                a.ptr(bad)
            with pytest.raises(TypeError, match="name must be a str"):
                a.nbytes(bad)
        with pytest.raises(AttributeError, match="read-only"):
            ptrs.raw = 1
        with pytest.raises(AttributeError, match="read-only"):
            del ptrs.raw
        with pytest.raises(AttributeError, match=r"no buffer 'hidden_states' in this arena's "
                                                 r"set of 9$"):
            ptrs.hidden_states              # a reference buffer this set lacks
        with pytest.raises(AttributeError, match="no buffer 'tiledd'.*did you mean tiled"):
            ptrs.tiledd                     # a typo: the near names, as arena.ptr says
        assert not hasattr(ptrs, "nope") and hasattr(ptrs, "tiled")
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(ptrs)
        assert a.sizes().buffers is CUSTOM
    # release: every pointer 0, in the table the engine kept too; sizes stay
    assert all(v == 0 for _, v in ptrs) and a.ptr("raw") == 0 and ptrs is a.ptrs
    assert a.nbytes("raw") == CUSTOM_SIZES["raw"]
    assert live_counts(gpu) == (0, 0)


def test_the_compiled_accessors_of_dropped_reference_buffers_refuse():
    kept = ("hidden_states", "logits", "scratch")
    buffers = BufferSet([REFERENCE[n] for n in kept]).with_(SAMPLER)
    with _new(buffers) as a:
        for name in POINTER:
            if name in kept:
                assert getattr(a, name)() == a.ptr(name) != 0
            else:
                with pytest.raises(MetraleError, match=f"{name}: not in this arena's buffer set"):
                    getattr(a, name)()
        for name in BYTES:
            if name in kept:
                assert getattr(a, f"{name}_bytes")() == a.nbytes(name)
            else:
                with pytest.raises(MetraleError, match=f"{name}: not in this arena's buffer set"):
                    getattr(a, f"{name}_bytes")()
        with pytest.raises(MetraleError, match="buffer set has no moe_fp8_scratch"):
            a.moe_fp8_scratch(ModelConfig.preset("qwen3-30b-a3b"), 1)
        with pytest.raises(MetraleError, match="its buffer set lacks the slab"):
            a.take_ssm_rowwise_w_bf16(16)
    # a set without hidden_states in front: the accessors still find theirs
    moved = BufferSet([SAMPLER, REFERENCE["logits"], REFERENCE["hidden_states"]])
    with _new(moved) as a:
        assert a.hidden_states() == a.ptr("hidden_states") and a.logits() == a.ptr("logits")
        assert a.logits_bytes() == 2 * min(M, max(160, 32 + 1)) * V


def test_a_reference_buffer_changed_by_the_set():
    buffers = REFERENCE.replace("logits", dtype="float32", size="4*Lr*V")
    with _new(buffers) as a, _new(REFERENCE) as r:
        assert a.logits_bytes() == 2 * r.logits_bytes() == 4 * M * V      # Lr = min(M, ...) = M
        assert a.view("logits").dtype == "float32" and a.view("logits").shape == (M, V)


def test_step_inputs_need_a_token_count():
    # no buffer holds the count (none at all, or token ids alone): refused
    # before anything is allocated
    for buffers in (CUSTOM, CUSTOM.with_(STEP_SPECS[0])):
        gpu = HostBackend()
        with _new(buffers, gpu) as a:
            with pytest.raises(MetraleError, match="no buffer of the arena's set holds the "
                                                   "token count: declare one with step='count'"):
                a.step_inputs()
            assert gpu.host_alloc_count == 0
    # the reference's scratch alone holds a count: step inputs without token ids
    with _new(CUSTOM.with_(STEP_SPECS[1]), HostBackend()) as a, a.step_inputs() as st:
        assert "token_ids" not in st.names and st.max_batch_tokens == 0
        with pytest.raises(TypeError, match="needs token_ids, or tokens="):
            st.fill(positions=[1])
        st.fill(tokens=3, positions=[1, 2, 3])
        st.upload()
        assert _host_bytes(a.ptr("scratch") + 32752, 4).view(np.int32)[0] == 3


def test_step_inputs_buffers_keep_the_reference_alignment():
    # one upload reaches token_ids and scratch back to back: no other alignment
    for i, name in ((0, "token_ids"), (1, "scratch")):
        with pytest.raises(ValueError, match=f"buffer spec '{name}': align: .*256 only"):
            CUSTOM.with_(STEP_SPECS[i].replace(align=512))
    with pytest.raises(ValueError, match="buffer spec 'token_ids': zero_all"):
        CUSTOM.with_(STEP_SPECS[0].replace(zero_all=True))


def test_step_inputs_work_over_a_custom_set():
    # the step inputs placed first, back to back, whatever the set's order:
    # the one upload reaches both
    buffers = CUSTOM.with_([STEP_SPECS[1], STEP_SPECS[0]])
    gpu = HostBackend()
    with _new(buffers, gpu) as a:
        assert a.ptr("token_ids") + _ceil(a.nbytes("token_ids"), 256) == a.ptr("scratch")
        for name in ("allreduce_staging", "tiled", "sampler_probs"):
            _host_bytes(a.ptr(name), a.nbytes(name))[:] = 0xAB
        with a.step_inputs() as st:
            st.fill(np.arange(5, dtype=np.uint32) + 7)
            st.upload()
            assert list(_host_bytes(a.ptr("token_ids"), 20).view(np.uint32)) == [7, 8, 9, 10, 11]
            count = _host_bytes(a.ptr("scratch") + 32752, 4).view(np.int32)[0]
            assert count == 5
            # zero_all_rows for the 5 uploaded tokens: staging's first 5 rows,
            # tiled's first 16, the not-zeroed sampler untouched
            staging = _host_bytes(a.ptr("allreduce_staging"), a.nbytes("allreduce_staging"))
            assert not staging[:5 * 2 * H].any() and (staging[5 * 2 * H:] == 0xAB).all()
            tiled = _host_bytes(a.ptr("tiled"), a.nbytes("tiled"))
            assert not tiled[:16 * 2 * H].any() and (tiled[16 * 2 * H:] == 0xAB).all()
            assert (_host_bytes(a.ptr("sampler_probs"), 4 * BS * V) == 0xAB).all()


def test_views_take_the_spec_dtype_and_exact_shape():
    shapes = {"allreduce_staging": ("bfloat16", (M, H)), "tiled": ("bfloat16", (_ceil(M, 16), H)),
              "rows_m3": ("float32", (M, 3)), "sampler_probs": ("float32", (BS, V)),
              "splitkv_lse": ("float32", (BS, HQ, 16)), "flags": ("int32", (7,)),
              "idx": ("int32", (M, 2))}
    with _new() as a:
        for name, (dtype, shape) in shapes.items():
            v = a.view(name)
            assert (v.dtype, v.shape, v.ptr, v.nbytes) == (dtype, shape, a.ptr(name),
                                                          a.nbytes(name)), name
            del v
        arr = np.asarray(a.view("sampler_probs"))
        assert arr.dtype == np.float32 and arr.shape == (BS, V)
        del arr
        with pytest.raises(TypeError, match="raw has no element type|holds raw bytes"):
            a.view("raw")
        assert a.view("raw", "uint8").shape == (3 * M + 5,)
        assert a.view("tiled", "uint8").shape == (2 * _ceil(M, 16) * H,)
        # an empty buffer: only an empty view
        assert a.view("nothing").shape == (M, 0)
        with pytest.raises(ValueError, match="unknown buffer name"):
            a.view("hidden_states")


def test_views_of_text_shapes_and_conditional_shapes():
    buffers = BufferSet([
        BufferSpec("exact", "float32", "[M, 2*H]", shape_exact=True, size="4*M*2*H"),
        BufferSpec("described", "float32", "[M, H] or [M, 2*H]", size="max(4*M*H, 8*M*H)"),
        BufferSpec("when", "bfloat16", ["M", "H"], shape_when="E > 0"),      # dense: not exact
        BufferSpec("floored", "int32", ["max_batch_size"], floor=4096),
        BufferSpec("bytes4", shape=["M", 5], itemsize=4),                     # no dtype: raw
    ])
    with _new(buffers) as a:
        assert a.view("exact").shape == (M, 2 * H)
        assert a.view("described").shape == (2 * M * H,)          # only a description: 1-D
        assert a.view("when").shape == (M * H,)
        assert a.nbytes("floored") == 4096 and a.view("floored").shape == (BS,)
        assert a.nbytes("bytes4") == 4 * M * 5
        with pytest.raises(TypeError, match="give a dtype"):
            a.view("bytes4")


def _fill(a, value):
    for name in a.sizes().buffers.names:
        if a.nbytes(name):
            _host_bytes(a.ptr(name), a.nbytes(name))[:] = value


def _zeroed_prefix(a, name):
    """How many bytes from the start of `name` are 0 (the rest must hold 0xAB)."""
    data = _host_bytes(a.ptr(name), a.nbytes(name))
    nz = np.flatnonzero(data)
    k = int(nz[0]) if len(nz) else len(data)
    assert (data[k:] == 0xAB).all(), f"{name}: bytes past {k} changed"
    return k


# zero_all_rows(tokens=3) over CUSTOM at M = 50: the rule of each buffer, by hand
ROWS3 = {"allreduce_staging": 3 * 2 * H, "tiled": 16 * 2 * H, "rows_m3": 3 * 12,
         "splitkv_lse": 4 * BS * HQ * 16, "raw": 3 * M + 5, "idx": 3 * 8}


def test_zeroing_a_custom_set_on_the_host():
    with _new() as a:
        _fill(a, 0xAB)
        a.zero_all_rows(tokens=3)
        got = {n: _zeroed_prefix(a, n) for n in CUSTOM.names if a.nbytes(n)}
        assert got == {**dict.fromkeys(got, 0), **ROWS3}
        _fill(a, 0xAB)
        a.zero_prefill_essentials()
        assert {n: _zeroed_prefix(a, n) for n in got} == {**dict.fromkeys(got, 0),
                                                          "tiled": CUSTOM_SIZES["tiled"]}
        _fill(a, 0xAB)
        a.zero_all()
        zero_all = CUSTOM.groups["zero_all"]
        assert {n: _zeroed_prefix(a, n) for n in got} == {
            n: CUSTOM_SIZES[n] if n in zero_all else 0 for n in got}


def test_thirty_zero_all_buffers_and_a_count_read_inside_one():
    # 30 zero_all buffers (scratch and 29 more), the most one zero_all_rows
    # launch holds, plus the entry the count's hole splits off: every layout
    specs = [BufferSpec(f"z{i}", "float32", ["M", i % 5 + 1], zero_all=True,
                        rows=("M", "Mp", "M|Mp", "whole")[i % 4], prefill=i % 7 == 0)
             for i in range(29)]
    buffers = BufferSet(specs + list(STEP_SPECS))
    assert len(buffers.groups["zero_all"]) == 30
    hole = 16 * 12 + 4          # z13 is [M, 4] float32: row 12, its second word
    for kw in ({}, {"debug": True}, {"reserve": (64,) + LIMITS[1:]}):
        with _new(buffers, **kw) as a:
            _fill(a, 0xAB)
            _host_bytes(a.ptr("z13") + hole, 4).view(np.int32)[0] = 7
            a.zero_all_rows(tokens_at=a.ptr("z13") + hole)
            for spec in specs:
                n = a.nbytes(spec.name)
                data = _host_bytes(a.ptr(spec.name), n).copy()
                # 4 * k * 50 bytes: rows of M = 50 divide them, rows of 64 never
                # "M|Mp": the larger of 7 rows of 50 and 16 rows of 64, rounded up
                live = n if spec.rows in ("whole", "Mp") else 7 * (n // M) \
                    if spec.rows == "M" else min(n, max(7 * -(-n // M), 16 * -(-n // 64)))
                if spec.name == "z13":              # "Mp": cleared whole, but the count
                    assert list(data[hole:hole + 4].view(np.int32)) == [7]
                    data[hole:hole + 4] = 0
                assert not data[:live].any() and (data[live:] == 0xAB).all(), (spec.name, kw)
            with a.step_inputs() as st:
                st.fill(np.arange(3, dtype=np.uint32))
                st.upload()
                assert list(_host_bytes(a.ptr("token_ids"), 12).view(np.uint32)) == [0, 1, 2]
                assert not _host_bytes(a.ptr("z1"), 3 * 8).any()       # [M, 2]: 3 rows


def test_a_count_buffer_of_its_own_keeps_its_count():
    # A 4-byte zero_all buffer holding the count, between two others: the
    # hole covers it whole, so it has no entry of its own, and the padding
    # the buffer before it takes along used to run over it to the next one.
    buffers = BufferSet([BufferSpec("before", size=100, zero_all=True, prefill=True),
                         BufferSpec("count", "int32", [1], zero_all=True, prefill=True),
                         BufferSpec("rows", "bfloat16", ["M", "H"], zero_all=True, rows="M")])
    for kw in ({}, {"debug": True}, {"reserve": LIMITS}):
        with _new(buffers, **kw) as a:
            for count, live in ((2, 2), (-1, M), (M + 5, M)):
                _fill(a, 0xAB)
                _host_bytes(a.ptr("count"), 4).view(np.int32)[0] = count
                a.zero_all_rows(tokens_at=a.ptr("count"))
                assert _host_bytes(a.ptr("count"), 4).view(np.int32)[0] == count, kw
                assert _zeroed_prefix(a, "before") == 100
                assert _zeroed_prefix(a, "rows") == live * 2 * H


def test_a_reserved_arena_over_a_custom_set():
    gpu = HostBackend()
    top = (200,) + LIMITS[1:]
    with _new(gpu=gpu, reserve=top) as a:
        assert a.is_reserved()
        before = dict(a.ptrs)
        assert a.nbytes("allreduce_staging") == 2 * M * H
        _fill(a, 0xAB)
        a.zero_all_rows(tokens=3)
        assert {n: _zeroed_prefix(a, n) for n in ROWS3} == ROWS3
        a.resize(max_batch_tokens=130)                      # grow: sizes and rows follow
        assert dict(a.ptrs) == before
        sizes = a.sizes()
        assert sizes["allreduce_staging"] == 2 * 130 * H and sizes["raw"] == 3 * 130 + 5
        assert sizes["tiled"] == 2 * 144 * H and sizes["sampler_probs"] == 4 * BS * V
        assert a.nbytes("idx") == 8 * 130 and a.max_batch_tokens() == 130
        _fill(a, 0xAB)
        a.zero_all_rows(tokens=20)
        assert _zeroed_prefix(a, "allreduce_staging") == 20 * 2 * H
        assert _zeroed_prefix(a, "tiled") == 32 * 2 * H
        assert _zeroed_prefix(a, "raw") == 3 * 130 + 5
        assert _zeroed_prefix(a, "idx") == 20 * 8
        a.zero_all()
        for name in CUSTOM.groups["zero_all"]:
            assert _zeroed_prefix(a, name) == a.nbytes(name), name
        # sleep keeping one buffer; the init_zero buffer is zeroed at wake,
        # the zero_all ones too, the kept one restored, others undefined
        _fill(a, 0xCD)
        _host_bytes(a.ptr("sampler_probs"), 8)[:] = range(1, 9)
        a.sleep(keep=["sampler_probs"])
        assert gpu.mapped_bytes == 0 and dict(a.ptrs) == before
        with pytest.raises(MetraleError):
            a.zero_all()
        a.resize(max_batch_tokens=64)                       # asleep: only the limits
        a.wake()
        assert dict(a.ptrs) == before and a.nbytes("raw") == 3 * 64 + 5
        assert not _host_bytes(a.ptr("flags"), 28).any()
        for name in CUSTOM.groups["zero_all"]:
            assert not _host_bytes(a.ptr(name), a.nbytes(name)).any(), name
        kept = _host_bytes(a.ptr("sampler_probs"), 4 * BS * V)
        assert list(kept[:8]) == list(range(1, 9)) and (kept[8:] == 0xCD).all()
        with pytest.raises(ValueError, match="max_batch_tokens=201 exceeds the reserved"):
            a.resize(max_batch_tokens=201)
        committed = a.committed_bytes()
        a.resize(max_batch_tokens=1)
        assert a.committed_bytes() <= committed
    assert vm_counts(gpu) == (0, 0, 0) and live_counts(gpu) == (0, 0)


def test_resize_with_sizes_of_another_set_is_refused():
    with _new(reserve=(100,) + LIMITS[1:]) as a:
        other = BufferSizes.from_config(CFG, *LIMITS, env=NOENV, buffers=CUSTOM.without("raw"))
        with pytest.raises(ValueError, match="another buffer set"):
            a.resize(sizes=other)
        same = BufferSizes.from_config(CFG, 60, *LIMITS[1:], env=NOENV, buffers=CUSTOM)
        a.resize(sizes=same)
        assert a.nbytes("raw") == 3 * 60 + 5


# Poison patterns of docs/debug.md, by element type.
POISON = {"float32": bytes.fromhex("d17fd17f"), "bfloat16": bytes.fromhex("d17f"),
          "int32": bytes.fromhex("00000080")}


def test_a_debug_arena_over_a_custom_set():
    with _new(debug=True) as a:
        assert a.check_guards() == []
        # an overrun of 4 bytes past the end of raw (155 bytes) lands in its band
        _host_bytes(a.ptr("raw") + a.nbytes("raw"), 4)[:] = 0
        bad = a.check_guards()
        band = _ceil(3 * M + 5, 256) - (3 * M + 5) + 4096      # to 256, then the guard bytes
        assert [(g.buffer, g.offset, g.nbytes, g.band_bytes) for g in bad] == [("raw", 0, 4, band)]
        # poison: past the live rows of each row-trimmed buffer, in its dtype
        _fill(a, 0xAB)
        a.poison_rows(tokens=3)
        live = {"allreduce_staging": 3 * 2 * H, "tiled": 16 * 2 * H, "rows_m3": 3 * 12,
                "idx": 3 * 8, "raw": 3 * M + 5}
        for name in CUSTOM.groups["rows"]:
            data = _host_bytes(a.ptr(name), a.nbytes(name)).tobytes()
            k = live[name]
            assert data[:k] == b"\xab" * k, name
            dtype = CUSTOM[name].dtype
            if dtype is None:                       # raw bytes: nothing to poison with
                assert data[k:] == b"\xab" * (len(data) - k)
            else:
                pat = POISON[dtype]
                assert data[k:] == pat * ((len(data) - k) // len(pat)), name
        for name in ("sampler_probs", "splitkv_lse", "flags"):
            assert (_host_bytes(a.ptr(name), a.nbytes(name)) == 0xAB).all()
        # the scan reads the live rows of the float ones only, by their dtype
        a.zero_all()
        assert a.find_nonfinite(tokens=3) == []
        staging = _host_bytes(a.ptr("allreduce_staging"), a.nbytes("allreduce_staging"))
        staging[2 * (2 * H + 5):2 * (2 * H + 5) + 2] = [0x80, 0x7F]      # bf16 +Inf, row 2
        rows = _host_bytes(a.ptr("rows_m3"), a.nbytes("rows_m3")).view(np.float32)
        rows[4 * 3 + 1] = np.nan                                          # row 4: not live at 3
        _host_bytes(a.ptr("idx"), 4).view(np.int32)[0] = -1               # an int: never scanned
        found = a.find_nonfinite(tokens=3)
        assert [(f.buffer, f.nan, f.inf, f.first_offset, f.first_row) for f in found] == \
            [("allreduce_staging", 0, 1, 2 * (2 * H + 5), 2)]
        found = a.find_nonfinite(tokens=M)
        assert [(f.buffer, f.nan, f.first_row) for f in found] == \
            [("allreduce_staging", 0, 2), ("rows_m3", 1, 4)]


def test_the_checksum_probes_the_checksum_specs(caplog):
    with _new() as a:
        _fill(a, 0)
        values = np.arange(1, 3 * M + 1, dtype=np.float32)          # rows_m3: [M, 3] float32
        _host_bytes(a.ptr("rows_m3"), a.nbytes("rows_m3")).view(np.float32)[:] = values
        with caplog.at_level("DEBUG", logger="metrale"):
            a.debug_buffer_checksum(tag="t7", level=10)
        lines = [r.getMessage() for r in caplog.records if "METRALE_BUF_CKSUM" in r.getMessage()]
        assert len(lines) == 1 and lines[0].startswith("METRALE_BUF_CKSUM[t7] rows_m3 ")
        n = 3 * M
        assert f"bytes={4 * n} " in lines[0]
        fields = dict(kv.split("=") for kv in lines[0].split()[2:])
        assert float(fields["sum"]) == n * (n + 1) / 2
        assert float(fields["ssq"]) == n * (n + 1) * (2 * n + 1) / 6
        assert float(fields["sabs"]) == n * (n + 1) / 2


def test_fingerprints_over_a_custom_set():
    from test_debug import py_fingerprint      # docs/debug.md's hash, in plain Python
    with _new() as a:
        _fill(a, 0x11)
        _host_bytes(a.ptr("raw") + 100, 1)[:] = 0x12
        fp = a.fingerprint()
        live = [n for n in CUSTOM.names if CUSTOM_SIZES[n]]
        assert list(fp) == live
        for name in live:
            assert fp[name] == py_fingerprint(_host_bytes(a.ptr(name), a.nbytes(name)).tobytes())
        assert a.fingerprint(names=["raw", "nothing"]) == {"raw": fp["raw"],
                                                           "nothing": py_fingerprint(b"")}
        with pytest.raises(ValueError, match="unknown buffer name"):
            a.fingerprint(names=["hidden_states"])


def test_every_address_is_aligned_as_its_spec_asks():
    # The layout aligns offsets in the slab; the backends align their
    # allocations to 256 bytes, their reservations to the page (2 MiB on a
    # GPU).  A buffer's address must be aligned all the same.
    for align in (512, 8192, 1 << 16, 1 << 21):
        buffers = BufferSet([BufferSpec("small", size=100),
                             BufferSpec("big", size="M * 1000", align=align, zero_all=True),
                             BufferSpec("after", size=5, align=1024)])
        for kw in ({}, {"debug": True}, {"reserve": (120,) + LIMITS[1:]},
                   {"reserve": (120,) + LIMITS[1:], "debug": True}):
            gpu = HostBackend()
            with _new(buffers, gpu, **kw) as a:
                for spec in buffers:
                    assert a.ptr(spec.name) % spec.align == 0, (align, kw, spec.name)
                if "reserve" in kw:
                    assert gpu.reserved_bytes == a.slab_bytes() and gpu.live_bytes == 0
                    a.resize(max_batch_tokens=120)
                    assert a.ptr("big") % align == 0 and a.nbytes("big") == 120 * 1000
                else:
                    # room to move the base up to the largest alignment, in slab_bytes
                    assert gpu.live_bytes == a.slab_bytes()
                    assert a.sizes().total_bytes() + max(align, 1024) - 256 <= a.slab_bytes()
                _host_bytes(a.ptr("big"), a.nbytes("big"))[:] = 1
                a.zero_all()
                assert not _host_bytes(a.ptr("big"), a.nbytes("big")).any()
            assert live_counts(gpu) == (0, 0) and vm_counts(gpu) == (0, 0, 0), (align, kw)


# -- tensor parallelism: the set is part of the layout -------------------------------------------

# aligned beyond the host's page: the peers' reservations must be aligned too
ALIGNED = BufferSpec("aligned", "uint8", [1000], align=1 << 16)


def _rank_set(rank, which):
    if which == "same" or rank == 0:
        return CUSTOM.with_(ALIGNED)
    changed = CUSTOM.replace("raw", align=512) if which == "align" else CUSTOM.without("flags")
    return changed.with_(ALIGNED)


def rank_custom(rank, size, path, which):
    """Every rank builds a shared arena over its set: the same set shares
    (peer pointers by name); different sets fail every rank alike."""
    from metrale.tp import PeerGroup
    gpu = HostBackend()
    grp = PeerGroup(FileGroup(path, rank, size), timeout=20.0)
    buffers = _rank_set(rank, which)
    try:
        with BufferArena.new(CFG, *LIMITS, gpu, env=NOENV, buffers=buffers, group=grp) as a:
            other = a.peer(1 - rank)
            offsets = {n: other.ptr(n) - other.ptr("allreduce_staging") for n in buffers.names
                       if a.nbytes(n)}
            mine = {n: a.ptr(n) - a.ptr("allreduce_staging") for n in offsets}
            aligned = all(other.ptr(s.name) % s.align == 0 for s in buffers if a.nbytes(s.name))
            _host_bytes(a.ptr("raw"), a.nbytes("raw"))[:] = 0x30 + rank
            grp.all_gather("written")
            seen = int(_host_bytes(other.ptr("raw"), a.nbytes("raw")).max())
            grp.all_gather("read")
            with pytest.raises(MetraleError, match="not in this arena's buffer set"):
                other.hidden_states()
            return ("ok", offsets == mine and aligned, seen, live_counts(gpu))
    except MetraleError as e:
        return ("error", str(e), None, vm_counts(gpu) + live_counts(gpu))


def test_ranks_with_the_same_custom_set_share_it(tmp_path):
    outs = run_ranks(rank_custom, 2, args=(str(tmp_path), "same"))
    for rank, (what, same_offsets, seen, _) in enumerate(outs):
        assert what == "ok" and same_offsets and seen == 0x30 + (1 - rank), outs


@pytest.mark.parametrize("which", ["align", "dropped"])
def test_ranks_with_different_sets_fail_alike_naming_the_set(tmp_path, which):
    outs = run_ranks(rank_custom, 2, args=(str(tmp_path), which))
    (w0, m0, _, c0), (w1, m1, _, c1) = outs
    assert w0 == w1 == "error" and m0 == m1, outs
    fp0, fp1 = _rank_set(0, which).fingerprint(), _rank_set(1, which).fingerprint()
    assert "rank 1 and rank 0 disagree on the buffer set" in m0
    assert fp0 in m0 and fp1 in m0
    assert c0 == c1 == (0, 0, 0, 0, 0)
