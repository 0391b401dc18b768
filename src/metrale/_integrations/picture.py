"""metrale's pictures, as SVG: the slab of a plan, an arena's memory, the budget fit splits.

`fit_svg` and `states_svg` (in _pictures), `offload_svg` and `tp_svg` (in
_memory_pictures) draw the device budget of `fit`, an arena's states and
pins, what backs its addresses asleep, and the peer map of tensor
parallelism.  The rest of this module draws the slab, and `pool_svg` an
arena's reservation with its pool.

`render_svg` draws the slab of a plan (a `SlabPlan` and the `BufferSizes` it
places, as the CLI passes them) as one tall column, to scale: every placed
buffer is one rectangle whose top is at its offset and whose height is its
size, so the placement padding between buffers shows as gaps (a hatched
background).  Buffers thin enough to vanish at that scale keep their exact
(sub-pixel) rectangle; a leader line joins each buffer to its row in the
table beside the column, which names every buffer with its size, offset, the
padding after it and how much of it each zeroing helper clears.  The ranges of
``zero_all``, ``zero_prefill_essentials`` and ``zero_all_rows(T)`` are drawn
to scale in three lanes left of the column, with a marker where a range is too
thin to see.  The zero-size (NULL) buffers are listed below.

Every rectangle that stands for bytes carries its numbers as attributes
(``data-buffer``/``data-range``/``data-padding`` with ``data-offset`` and
``data-bytes`` or ``data-length``), so a test or another tool can check the
geometry against the plan.  The document is standalone: no script, no external
font or image.
"""

import math
import operator
import warnings

from ._memory_pictures import offload_svg, pool_svg, tp_svg
from ._pictures import fit_svg, states_svg
from ._svg import (_FILLS, _MONO, _MUTED, _SANS, _TEXT, _attrs, _esc, _human, _num, _shorten,
                   _text)
from .._sizing._layout import SlabPlan, plan_layout
from .._sizing.sizes import BufferSizes
from .._sizing.target import Target

__all__ = ["fit_svg", "offload_svg", "pool_svg", "render_svg", "states_svg", "tp_svg"]

# -- the layout, in SVG user units (1 unit = 1 CSS pixel at 100 % zoom) --------
_WIDTH = 1200
_MARGIN = 20
_AXIS_LABEL_X = 112          # offset labels end here (right-aligned)
_TICK_X0, _TICK_X1 = 116, 124
_LANE_X = (128, 146, 164)    # zero_all, zero_prefill, zero_all_rows lanes
_LANE_W = 14
_COL_X, _COL_W = 186, 240    # the slab column
_TABLE_X = 540               # where leader lines end and the table begins
_TOP = 286                   # y of slab offset 0
_MIN_HEIGHT = 760            # the column is at least this tall ...
_ROW_MIN = 20                # ... and each table row at least this tall
_ROW_MAX = 26                # rows spread over the column's height, up to this
_THIN = 2.0                  # a range thinner than this (units) also gets a marker

# Table columns: x positions (anchor noted where it is not "start").
_C_INDEX = 560               # end
_C_SWATCH = 566
_C_NAME = 584
_C_SIZE = 790                # end
_C_OFFSET = 902              # end
_C_PAD = 962                 # end
_C_ZERO = (1008, 1068, 1140)  # middle: zero_all, prefill, rows


# The zeroing ranges use saturated colours that no buffer fill (_svg._FILLS)
# is close to.
_RANGE_COLOURS = {"zero_all": "#d62728", "zero_prefill": "#ff7f0e", "zero_all_rows": "#1f77b4"}

# (plan key, name of the helper, short name for lane and table headers) for
# the three zeroing overlays, in lane order.
_RANGE_KINDS = (("zero_all", "zero_all", "zero_all"),
                ("zero_prefill", "zero_prefill_essentials", "prefill"),
                ("zero_all_rows", "zero_all_rows", "rows"))




# -- what is drawn ----------------------------------------------------------------

class _Plan:
    """The facts the picture draws, read from the typed plan once."""

    def __init__(self, layout, sizes, target, tokens, model, model_type, check):
        for value, name, kind in ((layout, "layout" if check else "plan", SlabPlan),
                                  (sizes, "sizes", BufferSizes),
                                  (target, "target", Target), (model, "model", str),
                                  (model_type, "model_type", str)):
            if not isinstance(value, kind):
                raise TypeError(f"{name} must be a {kind.__name__}, not {type(value).__name__}")
        limits = sizes.limits
        if limits is None:
            raise ValueError("sizes has no limits (made by hand): the picture shows the limits "
                             "they were computed for; use BufferSizes.from_config")
        rows_ranges = layout.rows_ranges(tokens)        # checks tokens, naming it
        # Each fact below is read from `layout`; a layout planned from other
        # sizes would draw these sizes at another plan's offsets.
        m = limits.max_batch_tokens
        if check and _layout_facts(layout, tokens) != _layout_facts(plan_layout(sizes), tokens):
            raise ValueError(f"layout is not the plan of sizes: plan_layout(sizes, {m}) "
                             "places them otherwise")
        self.model = model
        self.model_type = model_type
        self.limits = [(k, getattr(limits, k)) for k in
                       ("max_batch_tokens", "max_seq_len", "kv_block_size", "max_batch_size")]
        self.sm_count = target.sm_count
        self.splitk = target.splitk
        self.slab = layout.slab_bytes
        self.total = sizes.total_bytes()
        offsets = layout.offsets
        # (name, offset, bytes) in slab order; the empty (NULL) buffers have
        # no place and are listed apart, in canonical order.
        self.placed = [(n, offsets[n], sizes[n]) for n in layout.slab_order if sizes[n]]
        if not self.placed:
            raise ValueError("sizes places no buffer in the slab: every size is 0")
        # The placed buffers a set aligns beyond the slab's 256 bytes (name -> bytes).
        spec = sizes.buffers
        self.aligned = {n: spec[n].align for n, _, _ in self.placed if spec[n].align > 256}
        self.nulls = [n for n, b in sizes.items() if not b]
        self.tokens = operator.index(tokens)
        self.ranges = {"zero_all": [layout.zero_all], "zero_prefill": [layout.zero_prefill],
                       "zero_all_rows": rows_ranges}


def _layout_facts(layout, tokens):
    # Everything _Plan reads from a SlabPlan.
    return (layout.max_batch_tokens, layout.slab_bytes, layout.slab_order, layout.offsets,
            layout.zero_all, layout.zero_prefill, layout.rows_ranges(tokens))


# -- geometry -------------------------------------------------------------------

def _covered(off, n, ranges):
    """Bytes of [off, off + n) inside the union of `ranges`."""
    total, end = 0, off
    for r_off, r_len in sorted(ranges):
        lo, hi = max(r_off, end), min(r_off + r_len, off + n)
        if hi > lo:
            total += hi - lo
            end = hi
    return total


def _gaps(placed, slab):
    """(offset, bytes) of every stretch of the slab no buffer holds."""
    gaps, cursor = [], 0
    for _, off, n in sorted(placed, key=lambda t: t[1]):
        if off > cursor:
            gaps.append((cursor, off - cursor))
        cursor = max(cursor, off + n)
    if slab > cursor:
        gaps.append((cursor, slab - cursor))
    return gaps


def _with_tokens(p, key, name):
    """`name`, with the T of zero_all_rows(T) appended for that helper."""
    return f"{name}(T={p.tokens:,})" if key == "zero_all_rows" else name


def _tick_step(slab, height):
    """A power-of-two byte step giving offset ticks at least 56 units apart."""
    step = 256
    while step * height / slab < 56:
        step *= 2
    return step


def _axis_label(v):
    if v == 0:
        return "0"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if v >= scale:
            return f"{v / scale:g} {unit}"
    return f"{v} B"


# -- the drawing ----------------------------------------------------------------

def render_svg(plan, sizes=None, *, tokens, model, target=None, model_type=None):
    """Draw the slab of a plan, to scale, as a standalone SVG document.

    ``metrale plan --svg FILE`` calls it with the plan it prints.

    Parameters
    ----------
    plan : SlabPlan
        The placement drawn, ``plan_layout(sizes)``: its sizes
        (``plan.sizes``, made by `BufferSizes.from_config`) give the limits,
        the device and the model family of the title.
    sizes, target, model_type : optional
        The older form ``render_svg(plan, sizes, target=..., model_type=...)``,
        deprecated: the plan carries all three.  Given, `plan` must be the
        plan of `sizes`.
    tokens : int
        The T of the ``zero_all_rows(T)`` ranges drawn (>= 0).
    model : str
        The model as the reader knows it: a preset's name or a config path.

    Returns
    -------
    str
        The SVG document (UTF-8 text, with an XML declaration).  Each placed
        buffer is one ``<rect data-buffer=NAME data-offset=.. data-bytes=..>``
        whose ``y`` and ``height`` are its offset and size at the scale of the
        ``<rect data-slab="slab">`` column (``height / slab_bytes`` units per
        byte); the zeroing ranges are ``<rect data-range=KIND data-offset=..
        data-length=..>`` at the same scale, KIND one of ``zero_all``,
        ``zero_prefill``, ``zero_all_rows``; padding gaps are ``<rect
        data-padding="gap">``.  Coordinates are rounded to 1e-4 units.

    Raises
    ------
    TypeError
        An argument of the wrong type (the message names it).
    ValueError
        The sizes carry no limits, shape or target (built by hand) or place
        no buffer, the older form's `plan` is not the plan of `sizes`, or
        `tokens` is negative.
    """
    if sizes is None and target is None and model_type is None:
        if not isinstance(plan, SlabPlan):
            raise TypeError(f"plan must be a SlabPlan, not {type(plan).__name__}")
        sizes = plan.sizes
        if sizes.config is None or sizes.target is None:
            raise ValueError("the plan's sizes were built by hand: the picture shows the shape, "
                             "limits and device they were computed for; use "
                             "BufferSizes.from_config")
        p = _Plan(plan, sizes, sizes.target, tokens, model, sizes.config.model_type, False)
    else:
        warnings.warn("render_svg(plan, sizes, target=..., model_type=...) is deprecated: the "
                      "plan carries its sizes, their device and model family; write "
                      "render_svg(plan_layout(sizes), tokens=..., model=...)",
                      DeprecationWarning, stacklevel=2)
        p = _Plan(plan, sizes, target, tokens, model, model_type, True)
    rows = p.placed
    n_rows = len(rows)
    height = max(_MIN_HEIGHT, n_rows * _ROW_MIN)
    row_h = min(_ROW_MAX, height / n_rows)
    scale = height / p.slab                       # units per byte

    def y_of(off):
        return _TOP + off * scale

    out = []
    w = out.append
    table_bottom = _TOP + n_rows * row_h
    null_top = max(_TOP + height, table_bottom) + 44
    null_cols = 5
    null_h = 22 + 18 * max(1, math.ceil(len(p.nulls) / null_cols))
    doc_h = math.ceil(null_top + null_h + _MARGIN)

    w('<?xml version="1.0" encoding="UTF-8"?>')
    w(f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{doc_h}" '
      f'viewBox="0 0 {_WIDTH} {doc_h}" font-family="{_SANS}" role="img" '
      f'aria-labelledby="picture-title">')
    # The accessible title keeps the model name whole; the drawn one may shorten it.
    summary = f"Slab of {p.model}: {n_rows} buffers in {p.slab:,} bytes"
    w(f'<title id="picture-title">{_esc(summary)}</title>')
    w("<defs>"
      '<pattern id="padding-hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
      'patternTransform="rotate(45)"><rect width="6" height="6" fill="#f1f3f4"/>'
      '<rect width="2" height="6" fill="#9aa0a6"/></pattern>'
      "</defs>")
    w(f'<rect x="0" y="0" width="{_WIDTH}" height="{doc_h}" fill="#ffffff"/>')

    # Title: the model and every limit the plan was sized for.
    # About 12 units per character of 18-unit bold sans: the title gets
    # (_WIDTH - 2 * _MARGIN) / 12 characters, the model what the rest leaves.
    model_type = _shorten(p.model_type or "?", 24)
    budget = (_WIDTH - 2 * _MARGIN) // 12 - len("Slab of  ()") - len(model_type)
    w(_text(_MARGIN, 32, f"Slab of {_shorten(p.model, budget)} ({model_type})",
            size=18, weight="bold", data_title="model"))
    limits = " \u00b7 ".join(f"{k} {v:,}" for k, v in p.limits)
    w(_text(_MARGIN, 54, f"{limits} \u00b7 target {p.sm_count} SMs, split-K "
            f"{_shorten(p.splitk, 12)}", size=13, fill=_MUTED))
    aligned = "256-byte aligned offsets"
    if p.aligned:
        most = max(p.aligned.values())
        aligned = (f"aligned offsets (256 bytes; {len(p.aligned)} at their spec's, up to "
                   f"{_human(most)})")
    w(_text(_MARGIN, 74, f"one allocation of {p.slab:,} bytes ({_human(p.slab)}): "
            f"{n_rows} buffers at {aligned}, {len(p.nulls)} NULL; "
            f"total_bytes() {p.total:,}", size=13, fill=_MUTED))

    # Legend.
    _legend(w, p, rows, height, scale)

    # Offset axis: power-of-two ticks, plus the end of the slab.
    step = _tick_step(p.slab, height)
    w(_text(_AXIS_LABEL_X, _TOP - 10, "offset", size=10, anchor="end", fill=_MUTED))
    end_y = y_of(p.slab)
    for v in range(0, p.slab, step):
        y = y_of(v)
        if end_y - y < 14:          # leave room for the end label
            continue
        w(f'<line x1="{_TICK_X0}" y1="{_num(y)}" x2="{_TICK_X1}" y2="{_num(y)}" '
          f'stroke="{_MUTED}" stroke-width="1"/>')
        w(_text(_AXIS_LABEL_X, y + 4, _axis_label(v), size=10, anchor="end", fill=_MUTED,
                data_tick=v))
    w(f'<line x1="{_TICK_X0}" y1="{_num(end_y)}" x2="{_TICK_X1}" y2="{_num(end_y)}" '
      f'stroke="{_TEXT}" stroke-width="1"/>')
    w(_text(_AXIS_LABEL_X, end_y + 4, _human(p.slab), size=10, anchor="end",
            weight="bold", data_tick=p.slab))

    # The zeroing lanes: exact ranges, and a marker where a range is too thin.
    for (key, label, short), lx in zip(_RANGE_KINDS, _LANE_X):
        colour = _RANGE_COLOURS[key]
        w(f'<rect x="{lx}" y="{_TOP}" width="{_LANE_W}" height="{_num(height)}" '
          f'fill="#f1f3f4"/>')
        w(f'<text transform="translate({lx + _LANE_W / 2 + 4},{_TOP - 8}) rotate(-90)" '
          f'font-size="10" font-weight="bold" fill="{colour}" data-lane="{key}">'
          f"{_esc(_with_tokens(p, key, short))}</text>")
        for off, length in p.ranges[key]:
            y, h = y_of(off), length * scale
            w(f'<rect {_attrs(data_range=key, data_offset=off, data_length=length)} '
              f'x="{lx}" y="{_num(y)}" width="{_LANE_W}" height="{_num(h)}" fill="{colour}" '
              f'shape-rendering="crispEdges">'
              f"<title>{_esc(f'{label}: {length:,} bytes at offset {off:,}')}</title></rect>")
            if h < _THIN and length:
                cy = y + h / 2
                w(f'<path {_attrs(data_marker=key, data_offset=off)} '
                  f'd="M{lx} {_num(cy - 3.5)}L{lx + _LANE_W} {_num(cy)}L{lx} {_num(cy + 3.5)}Z" '
                  f'fill="{colour}"/>')

    # The slab: its hatched background shows through wherever no buffer is.
    # Crisp edges: anti-aliased fractional edges would let the hatch bleed
    # through between two adjacent buffers and fake a gap that is not there.
    w(_text(_COL_X + _COL_W / 2, _TOP - 10, "slab (offset 0 at the top)", size=11,
            anchor="middle", weight="bold"))
    w('<g shape-rendering="crispEdges">')
    w(f'<rect {_attrs(data_slab="slab", data_bytes=p.slab)} x="{_COL_X}" y="{_TOP}" '
      f'width="{_COL_W}" height="{_num(height)}" fill="url(#padding-hatch)"/>')
    for off, n in _gaps(rows, p.slab):
        w(f'<rect {_attrs(data_padding="gap", data_offset=off, data_bytes=n)} x="{_COL_X}" '
          f'y="{_num(y_of(off))}" width="{_COL_W}" height="{_num(n * scale)}" '
          f'fill="url(#padding-hatch)"/>')
    for i, (name, off, n) in enumerate(rows):
        fill = _FILLS[i % len(_FILLS)]
        y, h = y_of(off), n * scale
        w(f'<rect {_attrs(data_buffer=name, data_offset=off, data_bytes=n)} x="{_COL_X}" '
          f'y="{_num(y)}" width="{_COL_W}" height="{_num(h)}" fill="{fill}">'
          f"<title>{_esc(f'{name}: {n:,} bytes ({_human(n)}) at offset {off:,}')}</title></rect>")
    w("</g>")
    # Inline labels where a buffer is tall enough to hold one (the table names
    # every buffer anyway).
    for name, off, n in rows:
        h = n * scale
        size = 11 if h >= 13 else 9 if h >= 9.5 else 0
        if size:
            w(_text(_COL_X + _COL_W / 2, y_of(off) + h / 2 + size * 0.36,
                    f"{name} {_human(n)}", size=size, anchor="middle", data_inline=name))
    w(f'<rect x="{_COL_X}" y="{_TOP}" width="{_COL_W}" height="{_num(height)}" fill="none" '
      f'stroke="{_TEXT}" stroke-width="1"/>')

    _table(w, p, rows, row_h, y_of, scale)
    _null_list(w, p, null_top, null_cols)
    w("</svg>")
    return "\n".join(out) + "\n"


def _legend(w, p, rows, height, scale):
    y1, y2 = 128, 152
    x = _MARGIN
    w(_text(x, y1 - 22, "Zeroing helpers: the ranges each one clears, in the lanes left of "
            "the slab, to scale", size=12, weight="bold"))
    for key, label, _ in _RANGE_KINDS:
        ranges = p.ranges[key]
        total = sum(length for _, length in ranges)
        name = _with_tokens(p, key, label)
        count = "1 range" if len(ranges) == 1 else f"{len(ranges)} ranges"
        body = f"{name}: {count}, {_human(total)}"
        w(f'<rect x="{_num(x)}" y="{y1 - 10}" width="14" height="12" '
          f'fill="{_RANGE_COLOURS[key]}" data-legend="{key}"/>')
        w(_text(x + 20, y1, body, size=12, data_legend_text=key))
        x += 26 + 7.0 * len(body)
    x = _MARGIN
    w(f'<path d="M{x} {y2 - 10}L{x + 12} {y2 - 4}L{x} {y2 + 2}Z" fill="{_MUTED}"/>')
    thin = "a range thinner than 2 px at this scale (its exact rectangle is still drawn)"
    w(_text(x + 20, y2, thin, size=12))
    gaps = _gaps(rows, p.slab)
    pad = sum(n for _, n in gaps)
    x2 = _MARGIN + 20 + 6.6 * len(thin) + 24
    w(f'<rect x="{_num(x2)}" y="{y2 - 10}" width="14" height="12" fill="url(#padding-hatch)" '
      f'stroke="{_MUTED}" stroke-width="0.5"/>')
    gap_word = "gap" if len(gaps) == 1 else "gaps"
    w(_text(x2 + 20, y2, f"padding: {pad:,} bytes in {len(gaps)} {gap_word} "
            "(table: pad after)", size=12, data_legend_text="padding"))
    mib_per_px = 1 / scale / (1 << 20)
    per_px = (f"{mib_per_px:.3g} MiB" if mib_per_px >= 0.1
              else f"{1 / scale / 1024:.3g} KiB")
    w(_text(_MARGIN, y2 + 24, f"Scale: the column is {height:g} px for {_human(p.slab)}, "
            f"1 px = {per_px} of slab. Leader lines join each buffer's place to its row.",
            size=12, fill=_MUTED, data_legend_text="scale"))


def _table(w, p, rows, row_h, y_of, scale):
    head_y = _TOP - 10
    w(_text(_C_INDEX, head_y, "#", size=10, anchor="end", fill=_MUTED))
    w(_text(_C_NAME, head_y, "buffer", size=10, weight="bold"))
    w(_text(_C_SIZE, head_y, "size", size=10, anchor="end", weight="bold"))
    w(_text(_C_OFFSET, head_y, "offset (bytes)", size=10, anchor="end", weight="bold"))
    w(_text(_C_PAD, head_y, "pad after", size=10, anchor="end", weight="bold"))
    for (key, _, short), cx in zip(_RANGE_KINDS, _C_ZERO):
        w(_text(cx, head_y, _with_tokens(p, key, short), size=10, anchor="middle",
                weight="bold", fill=_RANGE_COLOURS[key]))

    order = sorted(range(len(rows)), key=lambda i: rows[i][1])
    next_start = {}
    for a, b in zip(order, order[1:]):
        next_start[a] = rows[b][1]
    col_right = _COL_X + _COL_W
    for i, (name, off, n) in enumerate(rows):
        fill = _FILLS[i % len(_FILLS)]
        ry = _TOP + (i + 0.5) * row_h
        base = ry + 4
        if i % 2:
            w(f'<rect x="{_C_INDEX - 24}" y="{_num(ry - row_h / 2)}" '
              f'width="{_WIDTH - _MARGIN - _C_INDEX + 24}" height="{_num(row_h)}" '
              f'fill="#f8f9fa"/>')
        # Leader: from the middle of the buffer (its exact place when thin) to
        # its row; the table is in slab order, so the lines do not cross when
        # the plan is too.
        ay = y_of(off) + n * scale / 2
        w(f'<path data-leader="{_esc(name)}" d="M{col_right} {_num(ay)}H{col_right + 12}'
          f'L{_C_INDEX - 30} {_num(ry)}H{_C_INDEX - 22}" fill="none" stroke="#9aa0a6" '
          f'stroke-width="0.8"/>')
        w(f'<circle cx="{col_right}" cy="{_num(ay)}" r="2" fill="{_TEXT}"/>')
        w(_text(_C_INDEX, base, str(i + 1), size=10, anchor="end", fill=_MUTED))
        w(f'<rect data-swatch="{_esc(name)}" x="{_C_SWATCH}" y="{_num(ry - 6)}" width="12" '
          f'height="12" fill="{fill}"/>')
        w(_text(_C_NAME, base, name, size=11, family=_MONO, data_label=name))
        w(_text(_C_SIZE, base, _human(n), size=11, anchor="end", data_size=name))
        w(_text(_C_OFFSET, base, f"{off:,}", size=11, anchor="end", family=_MONO,
                fill=_MUTED))
        end = next_start.get(i, p.slab)
        pad = end - (off + n)
        # Exact up to 64 KiB; beyond (a large alignment's gap) short, to fit the column.
        w(_text(_C_PAD, base, _pad_text(pad), size=11, anchor="end",
                fill=_RANGE_COLOURS["zero_all"] if pad else _MUTED, data_pad=name))
        for (key, _, _), cx in zip(_RANGE_KINDS, _C_ZERO):
            c = _covered(off, n, p.ranges[key])
            cell = "" if not c else "whole" if c == n else _human(c)
            if cell:
                w(_text(cx, base, cell, size=11, anchor="middle", fill=_RANGE_COLOURS[key],
                        data_zero=f"{key}:{name}"))


def _pad_text(pad):
    """The pad-after cell: bytes up to 64 KiB, a short binary size beyond."""
    if not pad:
        return "\u2013"
    return f"{pad:,} B" if pad < 65536 else _human(pad)


def _null_list(w, p, top, cols):
    w(_text(_MARGIN, top, f"NULL buffers ({len(p.nulls)}): size 0, pointer 0, no place "
            "in the slab", size=12, weight="bold"))
    if not p.nulls:
        w(_text(_MARGIN, top + 20, "none", size=11, fill=_MUTED))
        return
    col_w = (_WIDTH - 2 * _MARGIN) / cols
    for i, name in enumerate(p.nulls):
        x = _MARGIN + (i % cols) * col_w
        y = top + 20 + (i // cols) * 18
        w(_text(x, y, name, size=11, family=_MONO, fill=_MUTED, data_null=name))
