"""Pictures of what metrale computes and enforces (metrale.picture): the
device budget `fit` splits (`fit_svg`, ``metrale fit --svg``), and an
arena's states with the pins that refuse a change (`states_svg`).

Each rectangle that stands for bytes carries them as attributes
(``data-part``/``data-bytes``), and each cell of the pin table its pin
kind, transition and outcome, so a test can check the drawing against the
facts.  Standalone SVG: no script, no external font or image.
"""

from ._svg import (_BAR_W, _BAR_X, _MUTED, _SANS, _TEXT, _attrs, _esc, _human, _num, _shorten,
                   _text)

__all__ = ["fit_svg", "states_svg"]

_W = 900                     # document width, SVG user units
_M = 20                      # margin
_THIN = 2.0                  # a segment thinner than this (units) also gets a marker


def _head(w, height, title):
    w('<?xml version="1.0" encoding="UTF-8"?>')
    w(f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" '
      f'viewBox="0 0 {_W} {height}" font-family="{_SANS}" role="img" '
      'aria-labelledby="picture-title">')
    w(f'<title id="picture-title">{_esc(title)}</title>')
    w('<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
      'patternTransform="rotate(45)"><rect width="6" height="6" fill="#f1f3f4"/>'
      '<rect width="2" height="6" fill="#9aa0a6"/></pattern>'
      '<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
      f'markerHeight="7" orient="auto-start-reverse"><path d="M0 0L10 5L0 10Z" '
      f'fill="{_TEXT}"/></marker></defs>')
    w(f'<rect x="0" y="0" width="{_W}" height="{height}" fill="#ffffff"/>')


def _share(n, total):
    return f"{100 * n / total:.1f} %"


# -- fit: the device budget as one bar ------------------------------------------

# (part, label, fill) in the order the bar draws them: the weights (given to
# `fit_svg`, not to fit), then ArenaFit's terms in the order of
# ``budget = arena_bytes + pool_bytes + kv_bytes + headroom_bytes``, then
# what budget=None kept back from the free memory.
_PARTS = (("weights", "weights", "#9aa0a6"), ("arena", "arena", "#1a73e8"),
          ("pool", "torch pool", "#a142f4"), ("kv", "KV cache", "#34a853"),
          ("headroom", "headroom", "#fbbc04"), ("margin", "margin", "url(#hatch)"))


def fit_svg(fit, *, weights=0, model=None):
    """Draw how `fit` splits a device's memory, as one bar to scale.

    ``metrale fit --svg FILE`` calls it with the answer it prints.  Left to
    right: the model weights (when given), the arena, its torch pool (with
    ``torch_pool_bytes``), the KV cache (with ``kv_bytes_per_token``), the
    headroom, and with ``budget=None`` the margin kept back from the free
    memory; a bracket spans the budget.

    Parameters
    ----------
    fit : ArenaFit
        What `metrale.fit` returned.
    weights : int, optional
        Bytes of the model weights on this device, drawn before the budget
        (``metrale fit --gpu-mem G --weights W``: the budget is G - W).
        Default 0: not drawn.
    model : str, optional
        The model as the reader knows it (a preset's name, a config
        path), for the title.

    Returns
    -------
    str
        The SVG document.  Each part is a ``<rect data-part=PART
        data-bytes=N>`` (PART one of ``weights``, ``arena``, ``pool``,
        ``kv``, ``headroom``, ``margin``; a part of 0 bytes is not drawn),
        side by side from ``x`` = 20 in the order above, ``width`` its
        share of 860 units: ``N / total`` of the ``<rect data-part="total"
        data-bytes=total>`` behind them.

    Raises
    ------
    TypeError
        `fit` is not an ArenaFit, or `weights` not an int.
    ValueError
        `weights` is negative, or `fit`'s terms do not sum to its budget.
    """
    from .._base._common import check_index
    from .fitting import ArenaFit
    if not isinstance(fit, ArenaFit):
        raise TypeError(f"fit must be an ArenaFit (what metrale.fit returns), not "
                        f"{type(fit).__name__}")
    weights = check_index(weights, "weights")
    terms = fit.arena_bytes + fit.pool_bytes + fit.kv_bytes + fit.headroom_bytes
    if terms != fit.budget:
        raise ValueError(f"fit: arena + pool + KV + headroom is {terms:,} bytes, not its budget "
                         f"of {fit.budget:,}: not an answer of metrale.fit")
    sizes = {"weights": weights, "arena": fit.arena_bytes, "pool": fit.pool_bytes,
             "kv": fit.kv_bytes, "headroom": fit.headroom_bytes, "margin": fit.margin_bytes}
    total = sum(sizes.values())
    scale = _BAR_W / total
    kind = "reserved" if fit.reserved else "one slab"
    notes = {
        "weights": "the model's, on this device",
        "arena": f"max_batch_tokens {fit.max_batch_tokens:,} ({kind})",
        "pool": "torch's memory in the arena, all of it mapped",
        "kv": (f"{fit.kv_tokens:,} tokens x {fit.kv_bytes_per_token:,} bytes"
               if fit.kv_bytes_per_token is not None else ""),
        "headroom": ("what is left" if fit.kv_bytes_per_token is not None
                     else "what the arena leaves: room for the KV cache"),
        "margin": "kept back from the free memory (budget=None)",
    }
    shown = [(p, label, fill) for p, label, fill in _PARTS if sizes[p]]
    height = 200 + 24 * len(shown)
    out = []
    w = out.append
    name = f" of {_shorten(model, 60)}" if model else ""
    _head(w, height, f"The device memory{name} as metrale.fit splits it: "
          + ", ".join(f"{label} {sizes[p]:,} bytes" for p, label, _ in shown))
    w(_text(_M, 30, f"Device memory{name}, as fit splits it", size=16, weight="bold"))
    why = {"budget": f"the arena at {fit.max_batch_tokens + 1:,} would not fit",
           "formulas": "the most the sizing formulas allow", "given": "as given"}[fit.limited_by]
    w(_text(_M, 50, f"max_batch_tokens {fit.max_batch_tokens:,} ({why}); max_seq_len "
            f"{fit.max_seq_len:,}, kv_block_size {fit.kv_block_size}, max_batch_size "
            f"{fit.max_batch_size}" + (f", tp_size {fit.tp_size} (one rank)"
                                       if fit.tp_size != 1 else ""), size=12, fill=_MUTED))
    y, h = 100, 56
    # The budget's bracket, above the bar.
    bx0 = _BAR_X + weights * scale
    bx1 = bx0 + fit.budget * scale
    w(f'<path data-bracket="budget" d="M{_num(bx0)} 92V84H{_num(bx1)}V92" fill="none" '
      f'stroke="{_TEXT}" stroke-width="1"/>')
    w(_text((bx0 + bx1) / 2, 78, f"budget {fit.budget:,} bytes ({_human(fit.budget)})",
            size=12, anchor="middle", weight="bold", data_label="budget"))
    w('<g shape-rendering="crispEdges">')
    w(f'<rect {_attrs(data_part="total", data_bytes=total)} x="{_BAR_X}" y="{y}" '
      f'width="{_BAR_W}" height="{h}" fill="#f1f3f4"/>')
    x = _BAR_X
    for p, label, fill in shown:
        n = sizes[p]
        w(f'<rect {_attrs(data_part=p, data_bytes=n)} x="{_num(x)}" y="{y}" '
          f'width="{_num(n * scale)}" height="{h}" fill="{fill}">'
          f"<title>{_esc(f'{label}: {n:,} bytes ({_share(n, total)})')}</title></rect>")
        x += n * scale
    w("</g>")
    w(f'<rect x="{_BAR_X}" y="{y}" width="{_BAR_W}" height="{h}" fill="none" '
      f'stroke="{_TEXT}" stroke-width="1"/>')
    x = _BAR_X
    for p, label, fill in shown:
        width = sizes[p] * scale
        inline = f"{label} {_human(sizes[p])}"
        if width > 7 * len(inline) + 8:     # about 7 units a character at 12
            dark = p in ("arena", "pool")
            w(_text(x + width / 2, y + h / 2 + 4, inline, size=12, anchor="middle",
                    fill="#ffffff" if dark else _TEXT, weight="bold", data_inline=p))
        elif width < _THIN:
            cx = x + width / 2
            w(f'<path data-marker="{p}" d="M{_num(cx)} {y + h}L{_num(cx - 4)} {y + h + 8}'
              f'L{_num(cx + 4)} {y + h + 8}Z" fill="{_TEXT}"/>')
        x += width
    w(_text(_BAR_X, y + h + 20, "0", size=10, fill=_MUTED))
    w(_text(_BAR_X + _BAR_W, y + h + 20, f"{total:,} bytes ({_human(total)})", size=10,
            anchor="end", fill=_MUTED))
    # The legend: every part drawn, with its bytes, share and what it is.
    ty = y + h + 50
    for p, label, fill in shown:
        n = sizes[p]
        w(f'<rect x="{_M}" y="{ty - 11}" width="14" height="14" fill="{fill}" '
          f'stroke="{_MUTED}" stroke-width="0.5"/>')
        w(_text(_M + 22, ty, label, size=12, weight="bold", data_legend=p))
        w(_text(330, ty, f"{n:,} bytes", size=12, anchor="end"))
        w(_text(410, ty, _human(n), size=12, anchor="end", fill=_MUTED))
        w(_text(475, ty, _share(n, total), size=12, anchor="end", fill=_MUTED))
        w(_text(495, ty, notes[p], size=12, fill=_MUTED))
        ty += 24
    w("</svg>")
    return "\n".join(out) + "\n"


# -- an arena's states and its pins --------------------------------------------

# The states an arena is in, as memory_stats() tells them apart (its
# "sleeping" and "released" flags), with what backs its buffers in each.
_STATES = (("awake", ("device memory mapped", "under every buffer")),
           ("asleep", ("device memory given back;", "offloaded buffers: host",
                       "memory at their addresses")),
           ("released", ("everything freed;", "every pointer reads 0")))
_RESHAPING = ("one at a time, alone:", "operations in flight", "waited for; new ones",
              "and views refused")
_TRANSITIONS = ("sleep", "wake", "resize", "trim", "release")

# What each kind of pin (`Pin.kind`, as `arena.pins()` lists them) does to each
# transition: (outcome, note lines).  tests/test_pictures.py checks every cell
# against a live arena, and the kinds against Pin's own docstring.
_AS_EXPORT = ("refused", ("MetraleError, as for", "peer_export"))
_PIN_RULES = {
    "view": (("views of one buffer, and", "arrays made from them"), {
        "sleep": ("depends", ("BufferError unless", "the buffer is", "offloaded")),
        "wake": ("allowed", ("an offloaded buffer's", "view stays valid")),
        "resize": ("depends", ("BufferError only for", "a buffer it shrinks")),
        "trim": ("allowed", ("views stay valid: the", "bytes are copied back")),
        "release": ("refused", ("BufferError; nothing", "freed, no new view")),
    }),
    "peer_export": (("its handles, mapped by its", "tensor-parallel peers"), {
        "sleep": ("refused", ("MetraleError: the", "peers' mappings would", "go stale")),
        "wake": ("refused", ("MetraleError: a", "shared arena never", "sleeps")),
        "resize": ("refused", ("MetraleError: release,", "build again on every", "rank")),
        "trim": ("refused", ("MetraleError, as for", "resize")),
        "release": ("allowed", ("not collective: a", "peer's import keeps", "the pages")),
    }),
    "peer_import": (("the peers' handles it maps", "(their slabs)"), {
        "sleep": _AS_EXPORT, "wake": _AS_EXPORT, "resize": _AS_EXPORT, "trim": _AS_EXPORT,
        "release": ("allowed", ("unmaps the peers'", "slabs first")),
    }),
    "pool": (("segments of its pool handed", "out (torch's tensors, graphs)"), {
        "sleep": ("allowed", ("they sleep at their", "addresses (to host", "with offload=['torch'])")),
        "wake": ("allowed", ("mapped again at the", "same addresses")),
        "resize": ("allowed", ("the pool is left", "alone")),
        "trim": ("allowed", ("the pool is left", "alone (Pool.trim)")),
        "release": ("refused", ("MetraleError until", "torch frees them", "(close_pool)")),
    }),
}
_OUTCOME = {"refused": ("#fce8e6", "#c5221f", "refused"),
            "allowed": ("#e6f4ea", "#137333", "allowed"),
            "depends": ("#fef7e0", "#b06000", "it depends")}


def _arena_state(arena):
    """The state of `arena` (an entry of _STATES) and its pins by kind."""
    stats = arena.memory_stats()
    if not stats["reserved"]:
        raise ValueError("states_svg: the arena is not reserved: it has no sleep, wake or "
                         "resize (build it with reserve=...)")
    state = "released" if stats["released"] else "asleep" if stats["sleeping"] else "awake"
    held = {}
    for pin in arena.pins():
        held[pin.kind] = held.get(pin.kind, 0) + pin.count
    return state, held


def _box(w, x, y, bw, bh, name, lines, now, dashed=False):
    stroke = f'stroke-width="{3 if now else 1.2}"' + (' stroke-dasharray="6 4"' if dashed else "")
    w(f'<rect {_attrs(data_state=name, data_now="true" if now else None)} x="{x}" y="{y}" '
      f'width="{bw}" height="{bh}" rx="10" fill="{"#e8f0fe" if now else "#f8f9fa"}" '
      f'stroke="{_TEXT}" {stroke}/>')
    w(_text(x + bw / 2, y + 22, name + ("  (now)" if now else ""), size=14, anchor="middle",
            weight="bold"))
    for i, line in enumerate(lines):
        w(_text(x + bw / 2, y + 42 + 15 * i, line, size=11, anchor="middle", fill=_MUTED))


def _arrow(w, d, label, lx, ly, anchor="middle"):
    w(f'<path d="{d}" fill="none" stroke="{_TEXT}" stroke-width="1.4" '
      'marker-end="url(#arrow)"/>')
    w(_text(lx, ly, label, size=11, anchor=anchor, family="DejaVu Sans Mono, monospace",
            data_transition=label))


def states_svg(arena=None):
    """Draw a reserved arena's states, and which pins refuse which change.

    Above: the states (awake, asleep, released) and the reshapes between
    them (``resize``, ``trim``, ``sleep``, ``wake``, each run alone) and
    ``release``.  Below: a table of the kinds of `Pin` (``arena.pins()``)
    against those five changes, each cell saying whether a pin of that
    kind refuses it.  docs/stable-addresses.md and docs/lifetime.md give
    the rules.

    Parameters
    ----------
    arena : BufferArena, optional
        A reserved arena: its state is marked "now" and the table counts
        its pins of each kind.  None draws the diagram alone.

    Returns
    -------
    str
        The SVG document.  Each state is a ``<rect data-state=NAME>``
        (``data-now="true"`` on the arena's); each cell of the table a
        ``<rect data-pin=KIND data-transition=NAME data-outcome=OUTCOME>``,
        OUTCOME one of ``refused``, ``allowed``, ``depends``.

    Raises
    ------
    ValueError
        `arena` is not reserved.
    """
    state, held = _arena_state(arena) if arena is not None else (None, {})
    rows = list(_PIN_RULES.items())
    top, row_h, kind_w, col_w = 380, 62, 200, 132
    height = top + 34 + row_h * len(rows) + 50
    out = []
    w = out.append
    _head(w, height, "A reserved arena's states (awake, asleep, released), the reshapes "
          "between them, and the pins that refuse each")
    w(_text(_M, 30, "A reserved arena's states, and the pins that refuse a change", size=16,
            weight="bold"))
    w(_text(_M, 50, "resize, trim, sleep and wake are reshapes: each holds the arena alone; "
            "release waits for one in flight", size=12, fill=_MUTED))
    desc = dict(_STATES)
    bw, bh, y = 170, 100, 96
    _box(w, 30, y, bw, bh, "awake", desc["awake"], state == "awake")
    _box(w, 365, y, bw, bh, "reshaping", _RESHAPING, False, dashed=True)
    _box(w, 700, y, bw, bh, "asleep", desc["asleep"], state == "asleep")
    _box(w, 365, 262, bw, 76, "released", desc["released"], state == "released")
    # Into the reshape and out of it, on both sides: each label is what runs.
    _arrow(w, "M202 124H361", "sleep, resize, trim", 281, 116)
    _arrow(w, "M363 172H204", "wake, resize, trim", 281, 190)
    _arrow(w, "M537 124H696", "sleep, resize, trim", 616, 116)
    _arrow(w, "M698 172H539", "wake, resize, trim", 616, 190)
    _arrow(w, "M115 198V300H361", "release", 125, 290, anchor="start")
    _arrow(w, "M785 198V300H539", "release", 775, 290, anchor="end")
    # The pin table.
    w(_text(_M, top - 10, "What arena.pins() lists, and what each kind does to each change",
            size=13, weight="bold"))
    hy = top + 22
    w(_text(_M + 6, hy, "pin kind" + (": held now" if arena is not None else ""), size=12,
            weight="bold"))
    for j, t in enumerate(_TRANSITIONS):
        w(_text(_M + kind_w + col_w * j + col_w / 2, hy, t, size=12, anchor="middle",
                weight="bold", family="DejaVu Sans Mono, monospace"))
    for i, (kind, (what, cells)) in enumerate(rows):
        ry = top + 34 + row_h * i
        w(f'<rect x="{_M}" y="{ry}" width="{kind_w}" height="{row_h}" fill="#f8f9fa" '
          f'stroke="#dadce0"/>')
        count = f": {held.get(kind, 0)}" if arena is not None else ""
        w(_text(_M + 6, ry + 16, kind + count, size=12, weight="bold",
                family="DejaVu Sans Mono, monospace", data_pin_kind=kind))
        for k, line in enumerate(what):
            w(_text(_M + 6, ry + 30 + 12 * k, line, size=10, fill=_MUTED))
        for j, t in enumerate(_TRANSITIONS):
            outcome, note = cells[t]
            fill, ink, word = _OUTCOME[outcome]
            cx = _M + kind_w + col_w * j
            w(f'<rect {_attrs(data_pin=kind, data_transition=t, data_outcome=outcome)} '
              f'x="{cx}" y="{ry}" width="{col_w}" height="{row_h}" fill="{fill}" '
              f'stroke="#dadce0"/>')
            w(_text(cx + 6, ry + 15, word, size=11, weight="bold", fill=ink))
            for k, line in enumerate(note):
                w(_text(cx + 6, ry + 29 + 12 * k, line, size=10, fill=_TEXT))
    ly = top + 34 + row_h * len(rows) + 28
    w(_text(_M, ly, "A shared (tensor-parallel) arena has both peer pins from its "
            "construction to its release; the pool pin lasts while torch holds a segment.",
            size=11, fill=_MUTED))
    w("</svg>")
    return "\n".join(out) + "\n"
