"""Where each step input lies in the staging `StepInputs` uploads, and what a
region takes (metrale/_arena/_step.pyx builds the staging from this).

The buffers whose spec says what they hold of a step (`BufferSpec.step`) sit
first in the slab, back to back (src/layout.c): one span, one copy.  A region
is named by its role (``token_ids``, ``count``, ``positions``), or, for the
reference's decode metadata inside its scratch, by the metadata's own names
(``seq_slot``, ``slots``, ``seq_lens``, ``block_table``), or by the buffer's
name (``step="metadata"``).  Pure Python; numpy only inside `check_array`.
"""

from .._base._common import check_index
from .._base._record import Record
from .decode_meta import _DECODE_META_OFFSET, _STEP_COUNT_OFFSET, kv_blocks_per_seq

__all__ = ["StepPlan", "plan_step", "check_array", "fill_arrays"]

# The regions named by their role; metadata buffers are named by themselves.
BY_ROLE = ("token_ids", "count", "positions")
# decode metadata region -> (numpy dtype name, its offset method of DecodeMetaLayout)
_META_REGIONS = (
    ("positions", "uint32", "positions_offset"),
    ("seq_slot", "int32", "seq_slot_offset"),
    ("slots", "int64", "slots_offset"),
    ("seq_lens", "int32", "seq_lens_offset"),
)
# numpy integer dtype name -> the values it holds, for the range check of fill().
_INT_RANGES = {f"{u}int{b}": ((0, 2**b - 1) if u else (-2**(b - 1), 2**(b - 1) - 1))
               for u in ("", "u") for b in (8, 16, 32, 64)}
# Regions that hold lengths: never negative, whatever their type could hold.
_LENGTHS = frozenset(["seq_lens"])
_SAFE = {}          # (array dtype, region dtype) -> every value fits


class StepPlan(Record):
    """The staging of one arena's step inputs (slab offsets).

    Attributes
    ----------
    regions : dict
        Region name -> (numpy dtype name, slab offset or None where the
        buffer is empty, shape).
    alias : dict
        The name of a buffer holding a role -> the role's region.
    live : list of tuple
        (start, end) of each non-empty step buffer, ascending.
    lo, hi : int
        The span one upload copies.
    count_at : int
        Slab offset of the int32 token count.
    layout : DecodeMetaLayout or None
        The reference's decode metadata layout, where the set has it.
    max_blocks : int
        Its block table's columns (0 without it).
    """

    __slots__ = ("regions", "alias", "live", "lo", "hi", "count_at", "layout", "max_blocks")


def _decode(spec, off, size, layout, limits, max_blocks, regions):
    """The reference's regions inside its scratch into `regions`; gives the
    end of the metadata (what the upload must reach) and the block columns."""
    if max_blocks is None:
        if limits is None:
            raise TypeError("step_inputs: the arena's sizes record no max_seq_len and "
                            "kv_block_size (made by hand): pass max_blocks")
        max_blocks = kv_blocks_per_seq(limits[1], limits[2])
    meta = layout.meta_bytes(max_blocks)
    if _DECODE_META_OFFSET + meta > size:
        raise ValueError(f"max_blocks={max_blocks}: the decode metadata ({meta} bytes at "
                         f"{spec.name} + {_DECODE_META_OFFSET}) does not fit {spec.name} "
                         f"({size} bytes)")
    m, R = off + _DECODE_META_OFFSET, layout.rows()
    regions["count"] = ("int32", off + _STEP_COUNT_OFFSET, (1,))
    for region, dtype, method in _META_REGIONS:
        regions[region] = (dtype, m + getattr(layout, method)(), (R,))
    regions["block_table"] = ("int32", m + layout.block_table_offset(), (R, max_blocks))
    return m + meta, max_blocks


def plan_step(steps, max_batch_tokens, own_shape, layout, limits, max_blocks):
    """Plan the staging of a set's step inputs.

    Parameters
    ----------
    steps : list of (BufferSpec, int, int)
        Each buffer with a step role, its slab offset and bytes, in slab
        order.
    max_batch_tokens : int
        The token ids' rows at most.
    own_shape : callable
        name -> the buffer's shape at the arena's limits, or None (1-D).
    layout : DecodeMetaLayout
        The arena's decode metadata layout (used with ``decode_meta``).
    limits : tuple or None
        The arena's (max_batch_tokens, max_seq_len, kv_block_size, ...).
    max_blocks : int or None
        As `BufferArena.step_inputs` takes it.

    Returns
    -------
    StepPlan

    Raises
    ------
    MetraleError
        No buffer holds the token count, or it is empty.
    TypeError, ValueError
        `max_blocks` missing, not fitting, or given without decode metadata.
    """
    from .._base.errors import MetraleError
    regions, alias, live = {}, {}, []
    lo, hi, count_at, dec = None, 0, None, None
    for spec, off, size in steps:
        role = spec.step
        name = role if role in BY_ROLE else spec.name
        if size == 0:
            if role in ("count", "decode_meta"):
                raise MetraleError(f"step_inputs: {spec.name} (step={role!r}) is empty at these "
                                   "limits: it holds the token count")
            regions[name] = (spec.dtype, None, (0,))
            continue
        end = off + size
        live.append((off, end))
        if role == "decode_meta":
            end, max_blocks = _decode(spec, off, size, layout, limits, max_blocks, regions)
            count_at, dec = off + _STEP_COUNT_OFFSET, layout
        elif role == "count":
            count_at = off
            regions[name] = ("int32", off, (1,))
        elif role == "token_ids":
            regions[name] = (spec.dtype, off, (min(size // spec.itemsize, max_batch_tokens),))
        else:
            regions[name] = (spec.dtype, off, own_shape(spec.name) or (size // spec.itemsize,))
        if role in BY_ROLE:
            alias[spec.name] = role
        lo, hi = off if lo is None else min(lo, off), max(hi, end)
    if count_at is None:
        raise MetraleError("step_inputs: no buffer of the arena's set holds the token count: "
                           "declare one with step='count' (int32, shape [1]), or take the "
                           "reference's token_ids and scratch (docs/step-inputs.md)")
    if dec is None and max_blocks is not None:
        raise ValueError("max_blocks: these step inputs hold no decode metadata (the reference's "
                         "scratch, step='decode_meta') to size")
    return StepPlan(regions=regions, alias=alias, live=live, lo=lo, hi=hi, count_at=count_at,
                    layout=dec, max_blocks=max_blocks if dec is not None else 0)


def _fits(have, want):
    """Whether every value of dtype `have` fits `want` (then the range scan
    is skipped: the common case, arrays of the region's own type)."""
    key = (have, want)
    ok = _SAFE.get(key)
    if ok is None:
        import numpy
        ok = bool(numpy.can_cast(have, want, "safe"))
        if len(_SAFE) < 256:
            _SAFE[key] = ok
    return ok


def check_array(name, value, dtype, shape, arg=None):
    """`value` as a numpy array that region `name` can take exactly.

    Parameters
    ----------
    name : str
        The region.
    value : array_like
        What the engine gives.
    dtype : str
        The region's numpy element type.
    shape : tuple of int
        The region's shape: the array's may be smaller in each dimension.
    arg : str, optional
        The argument `value` was given as, for the messages (`name` when
        None).

    Returns
    -------
    numpy.ndarray

    Raises
    ------
    ValueError
        Not an array (ragged nesting, an ``__array__`` that returns
        something else), a wrong dimension, a longer shape, or a value
        `dtype` cannot hold.
    TypeError
        Not numbers of the region's kind (integers; floats too for a float
        region); bool is refused.
    """
    import numpy
    label = name if arg is None else arg
    try:
        a = numpy.asarray(value)
    except ValueError as e:     # ragged nesting, an __array__ giving no array: numpy's
        raise ValueError(f"{label}: not a rectangular array of numbers ({e})") from None
    name, region = label, name
    if a.ndim != len(shape):
        raise ValueError(f"{name} must be {len(shape)}-D, got shape {a.shape}")
    for have, most in zip(a.shape, shape):
        if have > most:
            raise ValueError(f"{name} of shape {a.shape} does not fit its region of shape "
                             f"{shape}")
    if a.size == 0:
        return a                # nothing to write, whatever its type ([] is float64)
    floats = dtype.startswith("float")
    if a.dtype.kind not in ("iuf" if floats else "iu"):
        raise TypeError(f"{name} must hold {'numbers' if floats else 'integers'}, got dtype "
                        f"{a.dtype}")
    if _fits(a.dtype, dtype) and region not in _LENGTHS:
        return a
    if floats:
        most = float(numpy.finfo(dtype).max)
        if not numpy.all(numpy.abs(a[numpy.isfinite(a)]) <= most):
            raise ValueError(f"{name}: values must lie within +-{most:g} ({dtype})")
        return a
    lo, hi = _INT_RANGES[dtype]
    if region in _LENGTHS:
        lo = 0
    least, most = int(a.min()), int(a.max())
    if least < lo or most > hi:
        raise ValueError(f"{name}: values must lie in [{lo}, {hi}] ({dtype}), got "
                         f"{least} .. {most}")
    return a


def fill_arrays(regions, alias, given, tokens):
    """What one `StepInputs.fill` writes, every array checked before any is.

    Parameters
    ----------
    regions : dict
        Region -> (dtype, offset, shape), the step inputs' regions.
    alias : dict
        A role's buffer name -> its role's region.
    given : list of (str, object)
        Each argument as the caller named it, and its value (None: not
        given).
    tokens : int or None
        The count; None: the length of the token ids.

    Returns
    -------
    list of (str, numpy.ndarray), int
        (region, array) for each region given, and the count.

    Raises
    ------
    TypeError, ValueError
        As `StepInputs.fill` documents them.
    """
    checked, ids, by = [], None, {}
    for name, value in given:
        if value is None:
            continue
        region = alias.get(name, name)
        if region == "count" or region not in regions:
            raise TypeError(f"fill: these step inputs have no region {name!r} (they hold "
                            f"{', '.join(regions)}; the count is tokens=)")
        if region in by:
            raise TypeError(f"fill: {by[region]} and {name} both give the region {region!r} "
                            "(a role's region by its role and by its buffer's name): "
                            "give it once")
        by[region] = name
        dtype, _off, shape = regions[region]
        a = check_array(region, value, dtype, shape, name)
        checked.append((region, a))
        if region == "token_ids":
            ids = a
    if ids is None and tokens is None:
        raise TypeError("fill() needs token_ids, or tokens= (the count) when only the "
                        "other regions change")
    n = check_index(ids.shape[0] if tokens is None else tokens, "tokens", 0, 0x7FFFFFFF)
    return checked, n
