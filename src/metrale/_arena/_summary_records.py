"""The values an arena's report is made of (docs/lifetime.md, docs/torch.md):
each buffer as a `BufferInfo`, what pins its memory as a `Pin`, each class
(``BufferSpec(tag=)``, the pool's ``"torch"``) as a `ClassInfo`, the whole
arena as an `ArenaSummary` (``str()`` is a short report).  Pure Python;
metrale._arena._summary fills them from the arena.
"""

from metrale._base._record import Record


class BufferInfo(Record):
    """One buffer of an arena: where it is and how big.

    Attributes
    ----------
    name : str
        The buffer's name.
    ptr : int
        Device pointer; 0 when the buffer is empty or the arena is released.
    nbytes : int
        Size in bytes as sized (unchanged by release).
    offset : int or None
        Offset from the start of the slab; None for an empty buffer.
    dtype : str or None
        Element type, as its spec records it (``"bfloat16"``,
        ``"float32"``, ``"float8_e4m3fn"``, ``"int8"``, ``"int32"``,
        ``"uint32"`` ...); None where the buffer holds raw bytes, mixed
        elements or q8_1 blocks (docs/buffers.md says what instead).
    """

    __slots__ = ("name", "ptr", "nbytes", "offset", "dtype")
    _defaults = {"dtype": None}
    _hex = ("ptr",)


class Pin(Record):
    """One thing that keeps an arena's memory from being given back
    (`BufferArena.pins`).

    Attributes
    ----------
    kind : str
        ``"view"``: views of a buffer (and arrays made from them);
        ``"peer_export"``: the arena's physical handles exported to its
        tensor-parallel peers, whose mappings keep the pages however this
        process unmaps them; ``"peer_import"``: peers' handles this arena
        maps; ``"pool"``: segments of the arena's pool handed out (to
        torch: its tensors, cached blocks and graphs), which `release`
        waits for (they sleep with the arena, at their addresses).
    name : str or None
        The buffer, for views; else None.
    count : int
        Views, handles, or segments.
    tag : str or None
        The class the pin holds awake (``BufferSpec(tag=)``; ``"torch"`` for
        the pool's segments): a sleep of that class refuses while it stands.
        None for peer handles (of the whole arena).
    """

    __slots__ = ("kind", "name", "count", "tag")
    _defaults = {"tag": None}


class ClassInfo(Record):
    """One class of an arena: the buffers that sleep and wake together
    (``BufferSpec(tag=)``), or the pool (``"torch"``); `ArenaSummary.classes`.

    Attributes
    ----------
    name : str
        The class.
    buffers : tuple of str
        Its buffers, in the set's order (empty for ``"torch"``).
    asleep : bool
        Whether it sleeps now.
    epoch : int
        Its wakes so far (``Guard.epochs``).
    committed_bytes : int
        Physical bytes mapped for it now (the pool's: its segments').
    """

    __slots__ = ("name", "buffers", "asleep", "epoch", "committed_bytes")


def _mib(n):
    return f"{n / 1048576:,.2f} MiB"


class ArenaSummary(Record):
    """What an arena holds, as values (`BufferArena.summary`); ``str()`` is a
    short text report.

    Attributes
    ----------
    backend : str
        The backend, as its repr names it less its allocation counters
        (``live_bytes``: they count plain allocations, not what the arena
        maps; `committed_bytes` says that).
    max_batch_tokens : int
        The token limit the buffers are sized for.
    slab_bytes : int
        Bytes of the one allocation, placement padding included.
    total_bytes : int
        The sizes' `BufferSizes.total_bytes`.
    live_buffers : int
        Buffers with a non-zero size.
    null_buffers : tuple of str
        Buffers sized 0 (pointer 0).
    zero_all, zero_prefill : tuple of (int, int)
        (offset, length) in the slab of the range each helper clears.
    groups : dict of str to tuple of str
        Helper -> the buffers it covers.
    levers : dict of str to str
        Environment levers in effect when the sizes were computed.
    released : bool
        Whether the arena has been released.
    reserved : bool
        Whether the arena is reserved (stable addresses): `slab_bytes` is
        then the reservation, and zero_all / zero_prefill clear one range
        per buffer inside the span given above (one fused operation).
    committed_bytes : int
        Physical bytes mapped now (`BufferArena.committed_bytes`).
    sleeping : bool
        Whether the arena sleeps (`BufferArena.sleep`).
    guard_bytes : int
        A debug arena's guard bytes after every live buffer (docs/debug.md);
        0 without debug mode.  zero_all and zero_prefill then clear one
        range per buffer inside the span given above (one fused operation),
        leaving the guard bands out.
    unreleased_handles : int
        Physical handles of a reserved arena that are unmapped but whose
        release the backend refused (a driver error during `sleep`, a
        shrink or `release`); each is tried again at the next resize,
        sleep, wake and release.  0 normally.
    max_seq_len, kv_block_size : int or None
        The other limits the buffers are sized for (None when the sizes
        record none).
    max_batch_size : int
        The decode batch limit (it sets the decode metadata layout).
    tp_size : int
        The tensor-parallel ranks the buffers are per-rank sizes for.
    pool : dict or None
        The figures of the arena's pool (``Pool.stats``; `open_pool`), or
        None without one.
    classes : tuple of ClassInfo
        A reserved arena's classes, in the set's order, then the pool's
        (empty for an arena that never sleeps).
    """

    __slots__ = ("backend", "max_batch_tokens", "slab_bytes", "total_bytes", "live_buffers",
                 "null_buffers", "zero_all", "zero_prefill", "groups", "levers", "released",
                 "reserved", "committed_bytes", "sleeping", "guard_bytes", "unreleased_handles",
                 "max_seq_len", "kv_block_size", "max_batch_size", "tp_size", "pool", "classes")
    _defaults = {"reserved": False, "committed_bytes": 0, "sleeping": False, "guard_bytes": 0,
                 "unreleased_handles": 0, "max_seq_len": None, "kv_block_size": None,
                 "max_batch_size": None, "tp_size": 1, "pool": None, "classes": ()}

    def __hash__(self):
        return hash((self.backend, self.slab_bytes, self.zero_all, self.released))

    def __str__(self):
        state = " (released)" if self.released else " (sleeping)" if self.sleeping else ""
        if self.reserved:
            slab = (f"  slab:      {self.slab_bytes:,} bytes ({_mib(self.slab_bytes)}) reserved, "
                    f"{self.committed_bytes:,} ({_mib(self.committed_bytes)}) mapped")
            how = "one fused operation over {} ranges in {:,} bytes at offset {:,}"
            za = how.format(len(self.groups["zero_all"]), self.zero_all[1], self.zero_all[0])
            zp = how.format(len(self.groups["prefill"]), self.zero_prefill[1], self.zero_prefill[0])
        else:
            slab = f"  slab:      {self.slab_bytes:,} bytes ({_mib(self.slab_bytes)}), one allocation"
            za = f"one range of {self.zero_all[1]:,} bytes at offset {self.zero_all[0]:,}"
            zp = f"one range of {self.zero_prefill[1]:,} bytes at offset {self.zero_prefill[0]:,}"
        if self.guard_bytes:
            how = "one fused operation over {} ranges in {:,} bytes at offset {:,}"
            za = how.format(len(self.groups["zero_all"]), self.zero_all[1], self.zero_all[0])
            zp = how.format(len(self.groups["prefill"]), self.zero_prefill[1], self.zero_prefill[0])
            slab += f"; debug: a guard band after every live buffer ({self.guard_bytes:,} bytes + padding)"
        lines = [
            f"BufferArena on {self.backend}" + state,
            slab,
            f"  buffers:   {self.live_buffers} live, {len(self.null_buffers)} empty"
            + (f" ({', '.join(self.null_buffers)})" if self.null_buffers else ""),
            f"  sized for: max_batch_tokens={self.max_batch_tokens}, max_seq_len="
            f"{self.max_seq_len}, kv_block_size={self.kv_block_size}, max_batch_size="
            f"{self.max_batch_size}" + (f", tp_size={self.tp_size}" if self.tp_size != 1 else ""),
            f"  total_bytes(): {self.total_bytes:,} ({_mib(self.total_bytes)})",
            f"  zero_all:                {len(self.groups['zero_all'])} buffers, {za}",
            f"  zero_prefill_essentials: {len(self.groups['prefill'])} buffers, {zp}",
            f"  zero_all_rows:           {len(self.groups['rows'])} buffers row-trimmed",
            "  levers:    " + (", ".join(f"{k}={v}" for k, v in self.levers.items()) or "none"),
        ]
        if self.pool is not None:
            p = self.pool
            lines.append(
                f"  pool:      {p['reserved']:,} bytes ({_mib(p['reserved'])}) reserved, "
                f"{p['committed']:,} mapped, {p['in_use']:,} in {p['segments']} segments "
                f"(peak {p['peak_in_use']:,})"
                + (f", {p['offloaded']:,} offloaded" if p['offloaded'] else ""))
        if len(self.classes) > 1 or any(c.asleep for c in self.classes):
            lines.append("  classes:   " + "; ".join(
                f"{c.name} ({'asleep' if c.asleep else 'awake'}, {c.committed_bytes:,} bytes "
                f"mapped, woken {c.epoch}x)" for c in self.classes))
        if self.unreleased_handles:
            lines.append(f"  WARNING:   {self.unreleased_handles} physical handle(s) unmapped but "
                         "not released (the backend refused); retried at the next reshape "
                         "and at release")
        return "\n".join(lines)
