"""Pictures of a live arena's memory (metrale.picture): what backs its
addresses before and after an offloading sleep (`offload_svg`), its
reservation beside its pool's (`pool_svg`), and which rank's slab each
process of a tensor-parallel group maps (`tp_svg`).

Drawn from the arena itself (`buffers`, `memory_stats`, `peer`), in
offsets, never addresses: the same arena draws the same picture in every
process and every run.  Each rectangle that stands for a buffer carries its
name, offset and bytes as attributes (``data-buffer``, ``data-offset``,
``data-bytes``).
"""

from ._pictures import _head
from ._svg import (_BAR_H, _BAR_W, _BAR_X, _FILLS, _MUTED, _SANS, _TEXT, _attrs, _esc, _human,
                   _num, _text)

__all__ = ["offload_svg", "pool_svg", "tp_svg"]

_M = 20
_MONO = "DejaVu Sans Mono, monospace"
_FATES = {"device": "#34a853", "offloaded": "#f29900", "kept": "#4285f4",
          "discarded": "#ffffff"}


def _live(arena):
    """(offset, bytes, name) of every buffer with memory, in offset order."""
    return sorted((b.offset, b.nbytes, b.name) for b in arena.buffers.values() if b.nbytes)


def _granules(live, gran):
    """Bytes of the union of every buffer's granules: what an awake arena maps."""
    total, end = 0, 0
    for off, n, _ in live:
        lo, hi = max(off // gran * gran, end), -(-(off + n) // gran) * gran
        if hi > lo:
            total, end = total + hi - lo, hi
    return total


def _names(arg, what, arena):
    names = (arg,) if isinstance(arg, str) else tuple(arg)
    for n in names:
        if not isinstance(n, str) or n not in arena.buffers:
            raise ValueError(f"{what}: {n!r} is no buffer of the arena")
    return names


def _bar(w, y, label, sub, below=False):
    """A bar at `y` with its label and a second line, above it (or below)."""
    ly = y + _BAR_H + 18 if below else y - 22
    w(_text(_BAR_X, ly, label, size=12, weight="bold"))
    w(_text(_BAR_X, ly + 14, sub, size=11, fill=_MUTED))
    w(f'<rect x="{_BAR_X}" y="{y}" width="{_BAR_W}" height="{_BAR_H}" fill="#f1f3f4" '
      f'stroke="{_MUTED}" stroke-width="0.8"/>')


def _rect(w, row, scale, off, n, name, fill, y, h=_BAR_H, **extra):
    w(f'<rect {_attrs(data_row=row, data_buffer=name, data_offset=off, data_bytes=n, **extra)} '
      f'x="{_num(_BAR_X + off * scale)}" y="{_num(y)}" width="{_num(n * scale)}" '
      f'height="{_num(h)}" fill="{fill}" stroke="{_MUTED}" stroke-width="0.4">'
      f"<title>{_esc(f'{name}: {n:,} bytes at offset {off:,}')}</title></rect>")


def _labels(w, scale, named, y):
    """The names of `named` below the bar ending at `y`, on two levels in turn."""
    for i, (off, n, name) in enumerate(sorted(named)):
        cx = _BAR_X + (off + n / 2) * scale
        ty = y + 14 + 13 * (i % 2)
        w(f'<path d="M{_num(cx)} {y}V{_num(ty - 9)}" stroke="{_MUTED}" stroke-width="0.6"/>')
        half = 3.0 * len(name)              # 6 units a character of 10-unit mono
        tx = min(max(cx, _BAR_X + half), _BAR_X + _BAR_W - half)
        w(_text(tx, ty, name, size=10, anchor="middle", family=_MONO, data_name=name))


def offload_svg(arena, *, offload=(), keep=()):
    """Draw what backs a reserved arena's addresses, awake and asleep.

    Asleep, three bars to the scale of its reservation: awake (device
    memory under every buffer, as `wake` maps it again), asleep (the
    offloaded buffers' addresses backed by host memory, the kept and the
    discarded ones unmapped) and the host memory of the offload, mapped
    at a second range of the arena's for its whole life, the same pages
    the offloaded buffers' addresses map while it sleeps.  Awake, the
    first bar alone.  docs/stable-addresses.md says how it works.

    Parameters
    ----------
    arena : BufferArena
        A reserved arena, awake or asleep.
    offload, keep : iterable of str, optional
        Asleep: the buffers its `sleep` offloaded and kept (``sleep`` takes
        the same names; the arena counts their bytes, checked here).
        Awake: none.

    Returns
    -------
    str
        The SVG document.  Each buffer is a ``<rect data-row=ROW
        data-buffer=NAME data-offset=.. data-bytes=..>`` at ``x = 20 +
        offset * 860 / slab_bytes``, ``width = bytes * 860 / slab_bytes``;
        ROW ``awake`` for every buffer with memory, ``asleep`` for the
        same with ``data-fate`` ``offloaded``, ``kept`` or ``discarded``,
        and ``host`` for the offloaded ones.

    Raises
    ------
    ValueError
        The arena is not reserved or is released; a name is no buffer, or
        in both lists; the lists' bytes are not what the arena's sleep
        offloaded and kept (``memory_stats()``); names given for an awake
        arena.
    """
    stats = arena.memory_stats()
    if not stats["reserved"] or stats["released"]:
        raise ValueError("offload_svg: the arena is not reserved, or is released: nothing "
                         "sleeps (build it with reserve=...)")
    offload, keep = _names(offload, "offload", arena), _names(keep, "keep", arena)
    if set(offload) & set(keep):
        raise ValueError(f"offload and keep both name {sorted(set(offload) & set(keep))}")
    asleep = stats["sleeping"]
    sizes = {b.name: b.nbytes for b in arena.buffers.values()}
    if not asleep and (offload or keep):
        raise ValueError("offload_svg: the arena is awake: nothing is offloaded or kept")
    for names, key, what in ((offload, "offloaded_bytes", "offload"),
                             (keep, "kept_bytes", "keep")):
        if asleep and sum(sizes[n] for n in names) != stats[key]:
            raise ValueError(f"{what}: these buffers hold {sum(sizes[n] for n in names):,} "
                             f"bytes, the arena's sleep moved {stats[key]:,} "
                             f"(memory_stats()[{key!r}]): name what it was given")
    live = _live(arena)
    slab = stats["slab_bytes"]
    scale = _BAR_W / slab
    mapped = _granules(live, arena.backend().allocation_granularity())
    fate = {n: "offloaded" for n in offload} | {n: "kept" for n in keep}
    named = [t for t in live if t[2] in fate]
    height = 490 if asleep else 170
    out = []
    w = out.append
    args = ", ".join(f"{k}={list(v)}" for k, v in (("offload", offload), ("keep", keep)) if v)
    _head(w, height, f"A reserved arena of {slab:,} bytes: device memory under its buffers "
          "awake" + (f"; asleep after sleep({args}), offloaded buffers on host memory mapped "
                     "at their own addresses" if asleep else ""))
    w(_text(_M, 28, "Sleep with offload: the same addresses, other memory" if asleep else
            "An awake reserved arena: device memory under every buffer", size=16,
            weight="bold"))
    w(_text(_M, 48, f"one reservation of {slab:,} bytes ({_human(slab)}), {len(live)} buffers "
            "with memory, to scale; offsets, not addresses", size=12, fill=_MUTED))
    y = 100
    _bar(w, y, "awake" + (" (before the sleep, and after wake)" if asleep else ""),
         f"device memory under every buffer: {mapped:,} bytes mapped (each buffer's "
         "granules)")
    for off, n, name in live:
        _rect(w, "awake", scale, off, n, name, _FATES["device"], y)
    if not asleep:
        w("</svg>")
        return "\n".join(out) + "\n"
    _labels(w, scale, named, y + _BAR_H)
    y = 218
    _bar(w, y, f"asleep: sleep({args})",
         f"device memory given back; {stats['offloaded_bytes']:,} bytes offloaded, "
         f"{stats['kept_bytes']:,} kept, the rest discarded (unmapped)")
    for off, n, name in live:
        f = fate.get(name, "discarded")
        _rect(w, "asleep", scale, off, n, name, _FATES[f], y, data_fate=f)
    hy = 330
    _bar(w, hy, "host memory of the offload, at a second range of the arena's (mapped for "
         "its whole life)", f"{stats['host_offload_bytes']:,} bytes in "
         f"{stats['host_handles']} handle(s); asleep, the same pages are mapped at the "
         "offloaded buffers' own addresses too", below=True)
    for off, n, name in named:
        if fate[name] != "offloaded":
            continue
        x0, x1 = _BAR_X + off * scale, _BAR_X + (off + n) * scale
        # the same pages, mapped at both ranges
        w(f'<path data-link="{_esc(name)}" d="M{_num(x0)} {y + _BAR_H}L{_num(x1)} '
          f'{y + _BAR_H}L{_num(x1)} {hy}L{_num(x0)} {hy}Z" fill="{_FATES["offloaded"]}" '
          'fill-opacity="0.3"/>')
        _rect(w, "host", scale, off, n, name, _FATES["offloaded"], hy)
    # The kept buffers' pinned copies: host memory at no address of the arena's.
    kx, ky = _BAR_X + _BAR_W - 320, 418
    if keep:
        w(f'<rect data-copies="keep" x="{kx}" y="{ky}" width="320" height="26" '
          f'fill="{_FATES["kept"]}" fill-opacity="0.25" stroke="{_FATES["kept"]}"/>')
        w(_text(kx + 160, ky + 17, f"pinned host copies (keep): "
                f"{stats['host_keep_bytes']:,} bytes", size=11, anchor="middle"))
        for off, n, name in named:
            if fate[name] == "kept":
                cx = _BAR_X + (off + n / 2) * scale
                w(f'<path d="M{_num(cx)} {y + _BAR_H}L{kx + 160} {ky}" fill="none" '
                  f'stroke="{_FATES["kept"]}" stroke-width="1.2" stroke-dasharray="5 3"/>')
    lx = _M
    for label, f in (("device memory", "device"), ("host memory (offload)", "offloaded"),
                     ("unmapped, copied to the host (keep)", "kept"),
                     ("unmapped (discarded)", "discarded")):
        w(f'<rect x="{lx}" y="{height - 26}" width="14" height="14" fill="{_FATES[f]}" '
          f'stroke="{_MUTED}"/>')
        w(_text(lx + 20, height - 15, label, size=11))
        lx += 36 + 6.6 * len(label)
    w("</svg>")
    return "\n".join(out) + "\n"


# -- tensor parallelism: which rank's slab each process maps -------------------

_RANK_FILLS = ("#1a73e8", "#e8710a", "#188038", "#a142f4", "#d01884", "#129eaf", "#9aa0a6",
               "#b06000")


def _peer_map(arena):
    """(own rank, ranks mapped, {rank: [(offset, bytes, name)]}, stats) of a
    shared arena, each rank's buffers measured from `peer`: the address this
    process has for them less the rank's base here."""
    ranks = arena.peer_ranks()
    if not ranks:
        raise ValueError("tp_svg: the arena is not shared (build it with group=...)")
    live = _live(arena)
    first_off, _, first = live[0]
    own = None
    slabs = {}
    for q in ranks:
        pb = arena.peer(q)
        base = pb.ptr(first) - first_off
        slabs[q] = [(pb.ptr(name) - base, n, name) for _, n, name in live]
        if pb.ptr(first) == arena.buffers[first].ptr:
            own = q
    return own, ranks, slabs, arena.memory_stats()


def tp_svg(arenas):
    """Draw which rank's slab each process of a tensor-parallel group maps.

    One row per process (per shared arena given), one column per rank of
    the host: in its own column a process has its own memory (exported to
    the others), in every other column that rank's slab imported and
    mapped, its buffers at the same offsets.  docs/tensor-parallel.md says
    how the slabs are exchanged.

    Parameters
    ----------
    arenas : BufferArena or sequence of BufferArena
        Shared arenas (built with ``group=``) of one group: one process's
        (its own row), or every rank's where they live in one process (a
        test's ranks on threads).

    Returns
    -------
    str
        The SVG document.  Each buffer is a ``<rect data-rank=R
        data-owner=Q data-buffer=NAME data-offset=.. data-bytes=..>``:
        rank Q's buffer as the process of rank R maps it, its offset
        measured from ``arena.peer(Q)``; each slab a ``<rect data-rank=R
        data-owner=Q data-slab=own|imported data-bytes=..>``.

    Raises
    ------
    ValueError
        An arena is not shared, or the arenas are not of one group (other
        ranks mapped, or one rank twice).
    """
    from .._arena._buffer_arena import BufferArena
    if isinstance(arenas, BufferArena):
        arenas = [arenas]
    maps = sorted((_peer_map(a) + (a.slab_bytes(),) for a in arenas), key=lambda m: m[0])
    if not maps:
        raise ValueError("tp_svg: no arena given")
    ranks = maps[0][1]
    if any(m[1] != ranks for m in maps) or len({m[0] for m in maps}) != len(maps):
        raise ValueError("tp_svg: the arenas are not of one group: each must map the same "
                         "ranks, and be a different one")
    n = len(ranks)
    gap = 14
    gutter = 100                        # the process's name, left of its row
    col_w = (_BAR_W - gutter - gap * (n - 1)) / n
    row_h, top = 112, 96
    height = top + row_h * len(maps) + 40
    col_x = {q: _BAR_X + gutter + (col_w + gap) * i for i, q in enumerate(ranks)}
    out = []
    w = out.append
    _head(w, height, f"A tensor-parallel arena over ranks {list(ranks)} of one host: each "
          "process maps every rank's slab, its own exported, the others imported")
    w(_text(_M, 28, "Tensor parallelism: every process maps every rank's slab", size=16,
            weight="bold"))
    w(_text(_M, 48, f"ranks {', '.join(map(str, ranks))} on this host, {len(maps[0][2][ranks[0]])}"
            f" buffers each in a slab of {maps[0][4]:,} bytes, at the same offsets on every "
            "rank; one column per rank's memory", size=12, fill=_MUTED))
    # A pale band per column: rank q's memory, whichever process maps it.
    for q in ranks:
        fill = _RANK_FILLS[q % len(_RANK_FILLS)]
        w(f'<rect x="{_num(col_x[q] - 4)}" y="{top - 30}" width="{_num(col_w + 8)}" '
          f'height="{row_h * len(maps) + 12}" rx="6" fill="{fill}" fill-opacity="0.07"/>')
        w(_text(col_x[q] + col_w / 2, top - 14, f"rank {q}'s memory", size=12,
                anchor="middle", weight="bold", fill=fill))
    for i, (me, _, slabs, stats, slab) in enumerate(maps):
        y = top + row_h * i + 20
        w(_text(_M, y + 18, "process", size=12, weight="bold", data_process=me))
        w(_text(_M, y + 34, f"of rank {me}", size=12, weight="bold"))
        for q in ranks:
            fill = _RANK_FILLS[q % len(_RANK_FILLS)]
            scale = col_w / slab
            kind = "own" if q == me else "imported"
            x = col_x[q]
            w(f'<rect {_attrs(data_rank=me, data_owner=q, data_slab=kind, data_bytes=slab)} '
              f'x="{_num(x)}" y="{y}" width="{_num(col_w)}" height="44" fill="#ffffff" '
              f'stroke="{fill}" stroke-width="{2 if q == me else 1}"'
              + ('' if q == me else ' stroke-dasharray="5 3"') + '/>')
            for k, (off, nb, name) in enumerate(slabs[q]):
                w(f'<rect {_attrs(data_rank=me, data_owner=q, data_buffer=name, data_offset=off, data_bytes=nb)} '
                  f'x="{_num(x + off * scale)}" y="{y + 4}" width="{_num(nb * scale)}" '
                  f'height="36" fill="{fill}" fill-opacity="{0.9 if q == me else 0.45}" '
                  'stroke="#ffffff" stroke-width="0.3"/>')
            what = ((f"its own: device memory, {stats['exported_handles']} handle(s) "
                     "exported") if q == me else f"rank {q}'s, imported and mapped here")
            w(_text(x + col_w / 2, y + 60, what, size=11, anchor="middle",
                    fill=_TEXT if q == me else _MUTED))
        w(_text(_M, y + 80, f"rank {me} imports {stats['imported_handles']} handle(s), "
                f"{stats['imported_bytes']:,} bytes: its peers' slabs and signal areas",
                size=10, fill=_MUTED))
    # Rank q's memory, exported once from its own row to each other process's.
    rows = {m[0]: i for i, m in enumerate(maps)}
    for q in ranks:
        if q not in rows:
            continue
        for k, r in enumerate(r for r in rows if r != q):
            ax = col_x[q] + col_w - 24 - 10 * k
            y0, y1 = top + row_h * rows[q] + 20, top + row_h * rows[r] + 20
            a, b = (y0 + 44, y1) if y1 > y0 else (y0, y1 + 44)
            w(f'<path {_attrs(data_export=q, data_to=r)} d="M{_num(ax)} {a + 2}V{b - 3}" '
              f'stroke="{_RANK_FILLS[q % len(_RANK_FILLS)]}" stroke-width="1.5" '
              'marker-end="url(#arrow)"/>')
    w(_text(_M, height - 14, "Offsets, not addresses: each process maps a rank's slab at an "
            "address of its own; arena.peer(q) gives them. Set up once, at construction.",
            size=11, fill=_MUTED))
    w("</svg>")
    return "\n".join(out) + "\n"


# -- an arena's reservation: its buffers, and its pool with torch's segments ----

_POOL_FILLS = {"chunk": "#d2e3fc", "segment": "#1a73e8"}


def pool_svg(arena):
    """Draw a reserved arena's address space, to scale: its buffers, and its
    pool (``open_pool``) with the memory mapped and the segments handed out.

    Two bars, each scaled to its own range: the buffers' reservation (every
    live buffer one rectangle at its offset), and the pool's (the mapped
    chunks pale, the segments dark: what torch holds; asleep, nothing is
    mapped and the segments keep their places).  Offsets only, no
    addresses: the same arena draws the same picture in every process.

    Parameters
    ----------
    arena : BufferArena
        A reserved arena with a pool.

    Returns
    -------
    str
        The SVG document.  Each buffer is a ``<rect data-buffer=NAME
        data-offset=.. data-bytes=..>``, each mapped chunk of the pool a
        ``<rect data-chunk="mapped" ...>`` and each segment a ``<rect
        data-segment="in use" ...>``, with ``x`` and ``width`` at the scale
        of their bar (``width / bytes`` units per byte of its
        ``data-range`` rectangle).

    Raises
    ------
    MetraleError
        The arena has no pool (or is released).
    """
    from .._base.errors import MetraleError
    pool = arena.pool
    if pool is None or pool.closed:
        raise MetraleError("pool_svg: the arena has no pool (open_pool)")
    stats = arena.memory_stats()
    ps = pool.stats()
    placed = sorted((b.offset, b.nbytes, b.name) for b in arena.buffers.values()
                    if b.offset is not None and b.nbytes)
    slab = stats["slab_bytes"]
    segments = [(p - pool.base, n) for p, n in pool.segments()]
    out = []
    w = out.append
    height = 290
    w('<?xml version="1.0" encoding="UTF-8"?>')
    w(f'<svg xmlns="http://www.w3.org/2000/svg" width="900" height="{height}" '
      f'viewBox="0 0 900 {height}" font-family="{_SANS}" role="img" '
      f'aria-labelledby="picture-title">')
    w(f'<title id="picture-title">The arena\'s reservation: {len(placed)} buffers in '
      f'{slab:,} bytes; its pool of {ps["reserved"]:,} bytes, {ps["segments"]} segments'
      '</title>')
    w('<rect x="0" y="0" width="900" height="{}" fill="#ffffff"/>'.format(height))
    state = " (asleep)" if stats["sleeping"] else ""
    w(_text(_BAR_X, 28, f"An arena's reservation{state}: its buffers, and beside them the "
            "pool torch allocates from", size=15, weight="bold"))

    def bar(y, label, total, rects, kind_of):
        scale = _BAR_W / total
        w(_text(_BAR_X, y - 8, label, size=12, fill=_TEXT))
        w('<g shape-rendering="crispEdges">')
        w(f'<rect {_attrs(data_range=kind_of, data_bytes=total)} x="{_BAR_X}" y="{y}" '
          f'width="{_BAR_W}" height="{_BAR_H}" fill="#f1f3f4" stroke="{_MUTED}"/>')
        for attrs, off, n, fill, tip in rects:
            # a white edge: two neighbours stay two
            w(f'<rect {_attrs(**attrs, data_offset=off, data_bytes=n)} '
              f'x="{_num(_BAR_X + off * scale)}" y="{y}" width="{_num(max(n * scale, 0.5))}" '
              f'height="{_BAR_H}" fill="{fill}" stroke="#ffffff" stroke-width="0.5">'
              f'<title>{_esc(tip)}</title></rect>')
        w("</g>")
        w(_text(_BAR_X, y + _BAR_H + 14, "0", size=10, fill=_MUTED))
        w(_text(_BAR_X + _BAR_W, y + _BAR_H + 14, _human(total), size=10, anchor="end",
                fill=_MUTED))

    bar(70, f"buffers: {len(placed)} live in {slab:,} bytes reserved ({_human(slab)}), "
        f"{stats['committed_bytes']:,} mapped",
        slab, [({"data_buffer": name}, off, n, _FILLS[i % len(_FILLS)],
                f"{name}: {n:,} bytes at offset {off:,}")
               for i, (off, n, name) in enumerate(placed)], "buffers")
    rects = [({"data_chunk": "mapped"}, off, n, _POOL_FILLS["chunk"],
              f"mapped: {n:,} bytes at offset {off:,}") for off, n in pool.chunks()]
    rects += [({"data_segment": "in use"}, off, n, _POOL_FILLS["segment"],
               f"segment: {n:,} bytes at offset {off:,}") for off, n in segments]
    bar(170, f"pool: {ps['reserved']:,} bytes reserved ({_human(ps['reserved'])}), "
        f"{ps['committed']:,} mapped, {ps['in_use']:,} in {ps['segments']} segments"
        + (f", {ps['offloaded']:,} offloaded to host memory" if ps["offloaded"] else ""),
        ps["reserved"], rects, "pool")
    y = 250
    for i, (label, fill) in enumerate((("a buffer", _FILLS[0]),
                                       ("mapped, free (kept for reuse)",
                                        _POOL_FILLS["chunk"]),
                                       ("a segment (torch's)", _POOL_FILLS["segment"]),
                                       ("reserved, not mapped", "#f1f3f4"))):
        x = _BAR_X + i * 215
        w(f'<rect x="{x}" y="{y}" width="14" height="14" fill="{fill}" stroke="{_MUTED}"/>')
        w(_text(x + 20, y + 11, label, size=11, fill=_TEXT))
    w("</svg>")
    return "\n".join(out) + "\n"
