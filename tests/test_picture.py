"""metrale.picture: the SVG of a slab, drawn as `metrale plan --svg` draws it,
parsed and checked against the plan dict of `metrale plan --json` (geometry to
scale, overlays, labels, NULL list, escaping, argument checks),
plus the Chromium screenshot check of tools/render_svg.py where a browser is
installed."""

import importlib.util
import json
import random
import struct
import tempfile
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import pytest

import helpers
import reference_oracle as oracle
from metrale import BufferSizes, ModelConfig, Target, cli
from metrale._sizing._layout import plan_layout
from metrale.picture import render_svg

NS = "{http://www.w3.org/2000/svg}"

# Coordinates are written rounded to 1e-4 units (a ten-thousandth of a screen
# pixel), so a written y or height is within 0.5e-4 of the exact value; the
# scale is read back from the column's written height, which adds at most as
# much again.  1e-4 bounds both; at the largest slab here that is ~0.5 KiB of
# slab, far below what a screen shows.  Where a test adds two written numbers
# and compares with a third (an end against the next start), three roundings
# add up: OVERLAP_TOL.
TOL = 1e-4
OVERLAP_TOL = 2e-4


# The set of the "llama-set" plan, as a file (kept for the module's life).
_SET_DIR = tempfile.TemporaryDirectory(prefix="metrale-picture-")
SET_FILE = Path(_SET_DIR.name) / "engine.json"
SET_FILE.write_text(json.dumps({"drop": ["ffn_act_q8", "ffn_act_a", "fp8_act"], "buffer": [
    {"name": "staging", "dtype": "bfloat16", "shape": ["M", "H"], "zero_all": True,
     "rows": "M", "align": 2**20},
    {"name": "flags", "size": 1000, "align": 65536},
    {"name": "sampler", "dtype": "float32", "shape": ["max_batch_size", "V"], "total": False}]}))
SET_ALIGN = {"staging": 2**20, "flags": 65536}


def args_of(*argv):
    return cli._parser().parse_args(["plan", *argv])


def make_plan(*argv):
    return cli.plan(args_of(*argv))


def draw(*argv):
    """The SVG of `metrale plan ARGV --svg FILE`, as the CLI draws it."""
    args = args_of(*argv)
    return cli._picture(args, cli._Planned(args))


ARGV = {
    "qwen3-next-80b": ("--preset", "qwen3-next-80b"),
    "gemma-4-dense": ("--preset", "gemma-4-dense", "--tokens", "7"),
    "nemotron-h": ("--preset", "nemotron-h", "--tokens", "0"),
    # 1000 is not a multiple of 16: the ceil16 branch of zero_all_rows.
    "qwen-m1000-t3": ("--preset", "qwen3-next-80b", "--max-batch-tokens", "1000",
                      "--tokens", "3"),
    # A tiny max_batch_tokens: tokens >= m, rows ranges are zero_all's.
    "qwen-m1": ("--preset", "qwen3-next-80b", "--max-batch-tokens", "1"),
    # An engine's own set (issue 23): reference buffers dropped, new ones with
    # alignments of 64 KiB and 1 MiB (gaps past 64 KiB), one never zeroed.
    "llama-set": ("--preset", "llama-3.1-8b", "--max-batch-tokens", "64", "--tokens", "5",
                  "--buffers", str(SET_FILE), "--drop", "lora_xa"),
}
PLANS = {key: make_plan(*argv) for key, argv in ARGV.items()}
SVGS = {key: draw(*argv) for key, argv in ARGV.items()}


def parse(key):
    return ET.fromstring(SVGS[key])


def human(n):
    """The size label, written out again: 1 decimal, binary units."""
    if n < 1024:
        return f"{n} B"
    for unit, scale in (("KiB", 2 ** 10), ("MiB", 2 ** 20), ("GiB", 2 ** 30)):
        if round(n / scale, 1) < 1024:
            return f"{round(n / scale, 1):.1f}".removesuffix(".0") + f" {unit}"
    raise AssertionError(n)


def rects(root, attr, value=None):
    return [r for r in root.iter(NS + "rect")
            if r.get(attr) is not None and (value is None or r.get(attr) == value)]


def texts(root, attr=None):
    return [t for t in root.iter(NS + "text") if attr is None or t.get(attr) is not None]


def frame(root):
    """(top, units per byte, x, width) of the slab column."""
    (slab,) = rects(root, "data-slab")
    return (float(slab.get("y")), float(slab.get("height")) / int(slab.get("data-bytes")),
            float(slab.get("x")), float(slab.get("width")))


def box(r):
    return float(r.get("y")), float(r.get("height"))


@pytest.mark.parametrize("key", list(PLANS))
def test_every_buffer_one_rect_to_scale(key):
    plan = PLANS[key]
    root = parse(key)
    top, scale, x, width = frame(root)
    (slab,) = rects(root, "data-slab")
    assert int(slab.get("data-bytes")) == plan["slab_bytes"]
    placed = [b for b in plan["buffers"] if not b["null"]]
    assert {r.get("data-buffer") for r in rects(root, "data-buffer")} == \
        {b["buffer"] for b in placed}
    for b in placed:
        (r,) = rects(root, "data-buffer", b["buffer"])
        assert int(r.get("data-offset")) == b["offset"]
        assert int(r.get("data-bytes")) == b["bytes"]
        y, h = box(r)
        assert abs(y - (top + b["offset"] * scale)) <= TOL, b["buffer"]
        assert abs(h - b["bytes"] * scale) <= TOL, b["buffer"]
        # ... and back: the pixels give the offset to within TOL / scale bytes.
        assert abs((y - top) / scale - b["offset"]) <= TOL / scale
        assert (float(r.get("x")), float(r.get("width"))) == (x, width)


@pytest.mark.parametrize("key", list(PLANS))
def test_rects_do_not_overlap_and_gaps_are_the_padding(key):
    plan = PLANS[key]
    root = parse(key)
    top, scale, _, _ = frame(root)
    spans = sorted(box(r) for r in rects(root, "data-buffer"))
    for (y0, h0), (y1, _) in zip(spans, spans[1:]):
        assert y0 + h0 <= y1 + OVERLAP_TOL
    # The padding, computed from the plan: whatever of the slab no buffer holds.
    placed = sorted((b["offset"], b["bytes"]) for b in plan["buffers"] if not b["null"])
    gaps = [(o + n, nxt - o - n) for (o, n), (nxt, _) in
            zip(placed, placed[1:] + [(plan["slab_bytes"], 0)]) if nxt > o + n]
    if placed[0][0]:
        gaps.insert(0, (0, placed[0][0]))
    drawn = [(int(r.get("data-offset")), int(r.get("data-bytes")))
             for r in rects(root, "data-padding")]
    assert drawn == gaps
    for r in rects(root, "data-padding"):
        y, h = box(r)
        assert abs(y - (top + int(r.get("data-offset")) * scale)) <= TOL
        assert abs(h - int(r.get("data-bytes")) * scale) <= TOL
    # The pad column of the table says the same.
    pads = {t.get("data-pad"): t.text for t in texts(root, "data-pad")}
    by_end = dict(gaps)
    for o, n in placed:
        name = next(b["buffer"] for b in plan["buffers"] if b["offset"] == o)
        gap = by_end.get(o + n, 0)
        # exact bytes up to 64 KiB, a short size beyond (a large alignment's gap)
        assert pads[name] == (f"{gap:,} B" if 0 < gap < 65536 else human(gap) if gap
                              else "\u2013")


@pytest.mark.parametrize("key", list(PLANS))
def test_zero_range_overlays(key):
    plan = PLANS[key]
    root = parse(key)
    top, scale, _, _ = frame(root)
    expected = {"zero_all": [plan["zero_all"]], "zero_prefill": [plan["zero_prefill"]],
                "zero_all_rows": plan["zero_all_rows"]["ranges"]}
    lanes = set()
    for kind, ranges in expected.items():
        drawn = rects(root, "data-range", kind)
        assert [(int(r.get("data-offset")), int(r.get("data-length"))) for r in drawn] == \
            [(g["offset"], g["length"]) for g in ranges]
        lanes.add(drawn[0].get("x"))
        for r, g in zip(drawn, ranges):
            y, h = box(r)
            assert abs(y - (top + g["offset"] * scale)) <= TOL
            assert abs(h - g["length"] * scale) <= TOL
            # A range too thin to see gets a marker at its place.
            markers = [m for m in root.iter(NS + "path") if m.get("data-marker") == kind
                       and int(m.get("data-offset")) == g["offset"]]
            assert len(markers) == (1 if h < 2 and g["length"] else 0)
    assert len(lanes) == 3, "each helper has its own lane"
    # The T of zero_all_rows(T) is shown, in the lane, the legend and the table.
    tokens = plan["zero_all_rows"]["tokens"]
    all_text = [t.text or "" for t in texts(root)]
    assert sum(f"(T={tokens:,})" in t for t in all_text) >= 3
    legend = {t.get("data-legend-text"): t.text for t in texts(root, "data-legend-text")}
    n = len(expected["zero_all_rows"])
    assert legend["zero_all_rows"].startswith(
        f"zero_all_rows(T={tokens:,}): {'1 range' if n == 1 else f'{n} ranges'}")
    assert legend["zero_prefill"].startswith("zero_prefill_essentials: 1 range")


def test_zero_columns_follow_arena_rules():
    """The table's per-buffer zeroing cells, against ARENA.md §5 as the test
    helpers write it out (not against the plan's ranges), for every reference
    buffer of the oracle."""
    for key, m in (("qwen3-next-80b", 8192), ("qwen-m1000-t3", 1000), ("qwen-m1", 1)):
        plan = PLANS[key]
        tokens = plan["zero_all_rows"]["tokens"]
        cells = {t.get("data-zero"): t.text for t in texts(parse(key), "data-zero")}
        for b in plan["buffers"]:
            name, n = b["buffer"], b["bytes"]
            if b["null"] or name not in oracle.NAMES:
                continue
            rows = (helpers.expected_rows_length(name, n, m, tokens) if name in oracle.ROWS
                    else n if name in oracle.ZERO_ALL else 0)
            expect = {"zero_all": n if name in oracle.ZERO_ALL else 0,
                      "zero_prefill": n if name in oracle.PREFILL else 0,
                      "zero_all_rows": rows}
            for kind, L in expect.items():
                want = None if L == 0 else "whole" if L == n else human(L)
                assert cells.get(f"{kind}:{name}") == want, (key, kind, name)


@pytest.mark.parametrize("key", ["qwen3-next-80b", "gemma-4-dense"])
def test_labels_name_every_buffer_with_its_size(key):
    plan = PLANS[key]
    root = parse(key)
    names = {t.get("data-label"): t.text for t in texts(root, "data-label")}
    sizes = {t.get("data-size"): t.text for t in texts(root, "data-size")}
    for b in plan["buffers"]:
        if not b["null"]:
            assert names[b["buffer"]] == b["buffer"]
            assert sizes[b["buffer"]] == human(b["bytes"])
    # Big buffers are labelled inside their rectangle too, and every label fits it.
    top, scale, _, _ = frame(root)
    inline = {t.get("data-inline"): t for t in texts(root, "data-inline")}
    assert inline
    for name, t in inline.items():
        (r,) = rects(root, "data-buffer", name)
        y, h = box(r)
        assert y <= float(t.get("y")) <= y + h
        assert float(t.get("font-size")) <= h
        assert t.text == f"{name} {human(int(r.get('data-bytes')))}"


def test_known_size_labels():
    root = parse("qwen3-next-80b")
    inline = {t.text for t in texts(root, "data-inline")}
    assert "logits 46.4 MiB" in inline and "ssm_conv_out_f32 384 MiB" in inline
    sizes = {t.get("data-size"): t.text for t in texts(root, "data-size")}
    assert (sizes["scratch"], sizes["splitk_workspace"], sizes["o_latent"],
            sizes["norm_unit_w"]) == ("864.8 KiB", "48.4 KiB", "256 B", "4 KiB")


@pytest.mark.parametrize("key", list(PLANS))
def test_null_buffers_listed(key):
    plan = PLANS[key]
    root = parse(key)
    listed = [t.text for t in texts(root, "data-null")]
    assert listed == plan["null_buffers"]
    assert {b["buffer"] for b in plan["buffers"] if b["null"]} == set(listed)
    assert any(f"NULL buffers ({len(listed)})" in (t.text or "") for t in texts(root))


def test_title_and_limits():
    plan = PLANS["gemma-4-dense"]
    all_text = " ".join(t.text or "" for t in texts(parse("gemma-4-dense")))
    assert "Slab of gemma-4-dense (gemma4)" in all_text
    for k in ("max_batch_tokens", "max_seq_len", "kv_block_size", "max_batch_size"):
        assert f"{k} {plan[k]:,}" in all_text
    assert f"{plan['slab_bytes']:,} bytes" in all_text
    assert f"target {plan['target']['sm_count']} SMs" in all_text


def test_a_set_with_larger_alignments():
    plan = PLANS["llama-set"]
    root = parse("llama-set")
    offsets = {r.get("data-buffer"): int(r.get("data-offset")) for r in rects(root, "data-buffer")}
    assert set(offsets) == {b["buffer"] for b in plan["buffers"] if not b["null"]}
    assert not {"ffn_act_q8", "ffn_act_a", "fp8_act", "lora_xa"} & set(offsets)
    for name, align in SET_ALIGN.items():
        assert offsets[name] % align == 0
    all_text = " ".join(t.text or "" for t in texts(root))
    assert "buffers at aligned offsets (256 bytes; 2 at their spec's, up to 1 MiB)" in all_text
    assert "256-byte aligned offsets" not in all_text
    assert "256-byte aligned offsets" in " ".join(t.text or "" for t in texts(parse("nemotron-h")))
    # a gap of more than 64 KiB (before a MiB-aligned buffer), written short; the
    # rule for every pad cell is checked by test_rects_do_not_overlap_...
    pads = {t.get("data-pad"): t.text for t in texts(root, "data-pad")}
    size = {b["buffer"]: b["bytes"] for b in plan["buffers"]}
    order = sorted((o, n) for n, o in offsets.items()) + [(plan["slab_bytes"], None)]
    gaps = {a: nxt - o - size[a] for (o, a), (nxt, _) in zip(order, order[1:])}
    big = [a for a, g in gaps.items() if g >= 65536]
    assert big and all(pads[a] == human(gaps[a]) for a in big)


# Typed plans made here, not by the CLI: the qwen-m1 case, without levers.
SIZES = BufferSizes.from_config(helpers.PRESET, 1, 4096, 16, 32, env=helpers.NOENV)
LAYOUT = plan_layout(SIZES)
ARGS = {"target": Target.reference(), "tokens": 1, "model": "qwen3-next-80b",
        "model_type": "qwen3_next"}
# The older render_svg(layout, sizes, target=..., model_type=...), deprecated: it warns.
OLD_FORM = r"render_svg\(plan, sizes, target=\.\.\., model_type=\.\.\.\) is deprecated"


def draw_typed(layout=LAYOUT, sizes=SIZES, **changes):
    """The older form, whose layout and sizes are checked against each other."""
    with pytest.warns(DeprecationWarning, match=OLD_FORM):
        return render_svg(layout, sizes, **{**ARGS, **changes})


def test_special_characters_are_escaped(tmp_path):
    evil = "/tmp/<svg onload='x'>&amp;\"q\"\x01\udce9/config.json"
    # the model family drawn is the config's
    sizes = BufferSizes.from_config(helpers.PRESET.replace(model_type="<b>&"), 1, 4096, 16, 32,
                                    env=helpers.NOENV)
    doc = render_svg(plan_layout(sizes), tokens=1, model=evil)
    assert "<svg onload" not in doc and "<b>" not in doc
    root = ET.fromstring(doc)                     # still parses
    (title,) = [t for t in texts(root) if t.get("data-title") == "model"]
    # The characters XML cannot hold at all become U+FFFD; the rest read back.
    shown = evil.replace("\x01", "\ufffd").replace("\udce9", "\ufffd")
    assert title.text == f"Slab of {shown} (<b>&)"
    assert shown in root.find(NS + "title").text
    # The document also round-trips through a file, as the CLI will write it.
    (tmp_path / "p.svg").write_text(doc, encoding="utf-8")
    ET.parse(tmp_path / "p.svg")


def test_long_model_name_is_shortened_in_the_middle():
    model = "/data/" + "d" * 300 + "/config.json"
    root = ET.fromstring(render_svg(LAYOUT, tokens=1, model=model))
    (title,) = [t for t in texts(root) if t.get("data-title") == "model"]
    assert len(title.text) < 100 and title.text.endswith("/config.json (qwen3_next)")
    assert "\u2026" in title.text
    assert model in root.find(NS + "title").text


def test_standalone_small_and_deterministic():
    doc = SVGS["qwen3-next-80b"]
    assert doc == draw(*ARGV["qwen3-next-80b"])
    assert len(doc.encode()) < 1_000_000
    for external in ("<script", "<image", "@import", "@font-face", "href=", "<foreignObject"):
        assert external not in doc
    root = ET.fromstring(doc)
    assert root.tag == NS + "svg" and int(root.get("width")) > 0 and int(root.get("height")) > 0
    # Only the SVG namespace in use (a wrong xmlns would render nothing).
    assert all(el.tag.startswith(NS) for el in root.iter())


def test_cli_draws_the_plan_it_prints():
    """The CLI hands the picture the model, limits, target and T it was given:
    the same picture from typed objects made here with the CLI's defaults
    (8192 / 4096 / 16 / 32, the reference target) written out."""
    sizes = BufferSizes.from_config(ModelConfig.preset("gemma-4-dense"), 8192, 4096, 16, 32,
                                    target=Target(48, "legacy"))
    doc = render_svg(plan_layout(sizes), tokens=7, model="gemma-4-dense")
    assert doc == SVGS["gemma-4-dense"]


def test_kv_block_size_0_is_drawn():
    # 0 means 256 blocks: a limit the plan accepts, so the picture draws it.
    plan = make_plan("--preset", "nemotron-h", "--kv-block-size", "0")
    root = ET.fromstring(draw("--preset", "nemotron-h", "--kv-block-size", "0"))
    assert "kv_block_size 0 \u00b7" in " ".join(t.text or "" for t in texts(root))
    assert {r.get("data-buffer"): int(r.get("data-offset"))
            for r in rects(root, "data-buffer")} == \
        {b["buffer"]: b["offset"] for b in plan["buffers"] if not b["null"]}


def test_a_layout_is_checked_against_its_sizes():
    # Sizes that differ only inside the placement padding plan to the same
    # layout: the picture of sizes with that layout is the picture of their own plan.
    sizes = SIZES.replace(o_latent=SIZES.o_latent - 1)
    assert draw_typed(sizes=sizes) == draw_typed(plan_layout(sizes), sizes)
    assert draw_typed(sizes=sizes) != draw_typed()


ZEROS = SIZES.replace(**{name: 0 for name in SIZES})
# SIZES planned for another max_batch_tokens than theirs: only the older
# plan_layout(sizes, max_batch_tokens), deprecated for these sizes, makes it.
with pytest.warns(DeprecationWarning, match=r"write plan_layout\(sizes\)"):
    AT_M2 = plan_layout(SIZES, 2)


@pytest.mark.parametrize("change, error, words", [
    ({"layout": PLANS["qwen-m1"]}, TypeError, "layout must be a SlabPlan, not dict"),
    ({"sizes": dict(SIZES)}, TypeError, "sizes must be a BufferSizes, not dict"),
    ({"target": (48, "legacy")}, TypeError, "target must be a Target, not tuple"),
    ({"model": None}, TypeError, "model must be a str, not NoneType"),
    ({"model_type": None}, TypeError, "model_type must be a str, not NoneType"),
    ({"tokens": -1}, ValueError, "tokens must be >= 0"),
    ({"tokens": "1"}, TypeError, "tokens must be an int"),
    ({"sizes": BufferSizes(**SIZES)}, ValueError, "sizes has no limits"),
    ({"layout": AT_M2}, ValueError, "not the plan of sizes"),
    ({"layout": plan_layout(SIZES.replace(logits=SIZES.logits + 4096))}, ValueError,
     "not the plan of sizes"),
    ({"sizes": SIZES.replace(logits=SIZES.logits + 4096)}, ValueError, "not the plan of sizes"),
    ({"sizes": ZEROS, "layout": plan_layout(ZEROS)}, ValueError, "no buffer"),
])
def test_bad_arguments_are_named(change, error, words):
    with pytest.raises(error) as info:
        draw_typed(**change)
    assert words in str(info.value)


# -- tools/render_svg.py: the PNG decoder and the Chromium check ----------------

TOOL = Path(__file__).resolve().parent.parent / "tools" / "render_svg.py"


@pytest.fixture(scope="module")
def tool():
    if not TOOL.exists():
        pytest.skip(f"{TOOL} is not here (tests run from a copy, outside the source tree)")
    spec = importlib.util.spec_from_file_location("render_svg_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_image_is_current():
    # docs/slab.svg is `metrale plan --preset qwen3-next-80b --svg` (written by
    # tools/render_svg.py --write-docs): a change to the picture shows here.
    svg = TOOL.parent.parent / "docs" / "slab.svg"
    if not svg.exists():
        pytest.skip(f"{svg} is not here (tests run from a copy, outside the source tree)")
    assert svg.read_text(encoding="utf-8") == SVGS["qwen3-next-80b"], \
        "docs/slab.svg is stale: python tools/render_svg.py --write-docs"


def _encode_png(width, height, pixels, ctype, bpp, filters):
    """A PNG written with the given filter type per row (forward filters of
    the PNG specification, written out here independently of the decoder)."""
    stride = width * bpp
    prev = bytes(stride)
    raw = bytearray()
    for y in range(height):
        row = pixels[y * stride:(y + 1) * stride]
        ft = filters[y % len(filters)]
        out = bytearray()
        for i, x in enumerate(row):
            a = row[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ft == 0:
                pred = 0
            elif ft == 1:
                pred = a
            elif ft == 2:
                pred = b
            elif ft == 3:
                pred = (a + b) // 2
            else:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
            out.append((x - pred) % 256)
        raw += bytes([ft]) + out
        prev = row

    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, ctype, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(bytes(raw))) + chunk(b"IEND", b""))


@pytest.mark.parametrize("ctype, bpp", [(2, 3), (6, 4)])
def test_png_decoder_all_filters(tool, tmp_path, ctype, bpp):
    rng = random.Random(7)
    width, height = 13, 11
    pixels = bytes(rng.randrange(256) for _ in range(width * height * bpp))
    path = tmp_path / "t.png"
    path.write_bytes(_encode_png(width, height, pixels, ctype, bpp, [0, 1, 2, 3, 4, 4, 2]))
    w, h, rgb = tool.read_png(path)
    assert (w, h) == (width, height)
    want = pixels if bpp == 3 else bytes(v for i, v in enumerate(pixels) if i % 4 != 3)
    assert rgb == want


def test_png_decoder_refuses_what_it_cannot_read(tool, tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"GIF89a")
    with pytest.raises(ValueError, match="not a PNG"):
        tool.read_png(bad)
    png = bytearray(_encode_png(2, 2, bytes(12), 2, 3, [0]))
    png[24] = 16                                    # IHDR bit depth
    bad.write_bytes(bytes(png))
    with pytest.raises(ValueError, match="bit depth 16"):
        tool.read_png(bad)


def _white_png(width, height):
    # Filter 0 rows of white, built directly.
    body = zlib.compress((b"\x00" + b"\xff" * (3 * width)) * height)

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", body) + chunk(b"IEND", b""))


def test_check_rejects_blank_or_wrong_size_screenshots(tool, tmp_path):
    # A small stand-in picture keeps the decoding quick; the check reads only
    # the size and the data-buffer rects.
    svg = tmp_path / "p.svg"
    svg.write_text('<svg xmlns="http://www.w3.org/2000/svg" width="60" height="40">'
                   '<rect data-buffer="b" x="0" y="0" width="60" height="30" '
                   'fill="#aec7e8"/></svg>', encoding="utf-8")
    w, h = tool.svg_size(svg)
    png = tmp_path / "blank.png"
    png.write_bytes(_white_png(w, h))
    with pytest.raises(tool.CheckError, match="blank"):
        tool.check_screenshot(svg, png)
    png.write_bytes(_white_png(w, 4))
    with pytest.raises(tool.CheckError, match=f"is {w}x4, the SVG is {w}x{h}"):
        tool.check_screenshot(svg, png)


def test_chromium_screenshot_shows_the_picture(tool, tmp_path):
    chromium = tool.find_chromium()
    if chromium is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium)")
    svg, png = tmp_path / "slab.svg", tmp_path / "slab.png"
    svg.write_text(SVGS["gemma-4-dense"], encoding="utf-8")
    tool.screenshot(svg, png, chromium)
    report = tool.check_screenshot(svg, png)
    assert any(line.startswith("buffer fills") for line in report)


# -- pool_svg: an arena's reservation and its pool ---------------------------------

def test_the_pool_picture_is_to_scale():
    from metrale import HostBackend, MetraleError
    from metrale.picture import pool_svg
    arena = helpers._reserved(HostBackend())
    with pytest.raises(MetraleError, match="no pool"):
        pool_svg(arena)
    pool = arena.open_pool(64 * 4096)
    segs = [pool.alloc(n * 4096) for n in (2, 5, 1, 3)]
    pool.free(segs[1])
    root = ET.fromstring(pool_svg(arena))
    rects = root.iter(NS + "rect")

    def geometry(attr):
        return sorted((int(r.get("data-offset")), int(r.get("data-bytes")), float(r.get("x")),
                       float(r.get("width"))) for r in root.iter(NS + "rect") if r.get(attr))

    bars = {r.get("data-range"): r for r in rects if r.get("data-range")}
    scale = float(bars["pool"].get("width")) / int(bars["pool"].get("data-bytes"))
    x0 = float(bars["pool"].get("x"))
    want = [(p - pool.base, n) for p, n in pool.segments()]
    assert [(o, n) for o, n, _, _ in geometry("data-segment")] == want
    assert [(o, n) for o, n, _, _ in geometry("data-chunk")] == pool.chunks()
    for o, n, x, width in geometry("data-segment") + geometry("data-chunk"):
        assert x == pytest.approx(x0 + o * scale, abs=1e-3)
        assert width == pytest.approx(n * scale, abs=1e-3)
    placed = geometry("data-buffer")
    live = sorted((b.offset, b.nbytes) for b in arena.buffers.values() if b.nbytes)
    assert [(o, n) for o, n, _, _ in placed] == live
    for p in (segs[0], segs[2], segs[3]):
        pool.free(p)
    arena.release()
