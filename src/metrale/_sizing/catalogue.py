"""The buffer catalogue: what each buffer of a forward pass holds.

For every reference buffer (`CATALOGUE`, keyed by name in canonical order: the
specs of `metrale.reference.REFERENCE`) it records what the buffer holds, its
element type and shape, its byte size in words and as an expression over the
symbols of `metrale.formulas`, and why it can be empty.  ``metrale plan
--explain NAME`` prints one entry (`explain`), and ``tools/gen_docs.py`` writes
``docs/buffers.md`` and ``docs/levers.md`` from it.  Every function takes a
``buffers=`` set too, for an engine's own buffers.

The expressions are the sizing itself (`BufferSizes.from_config` evaluates
them); the test suite checks them against a second implementation written
from the formulas of the spec (tests/reference_sizes.py) and against its
golden values.  Which levers change a buffer is read from `metrale.levers`.

Importing this module is cheap: it loads the buffer table and the lever table
only; the sizing modules load on first use.
"""

from ._spec import ROW_WORDS
from .buffers import BufferSpec
from .reference import REFERENCE, buffer_set_arg
from .formulas import (ALIASES, SYMBOLS, TERMS, Symbol, Term, evaluate as _evaluate,
                       explanation, names_of as _names, terms_used, values)
from .._base._record import Record
from .levers import LEVERS

__all__ = [
    "Entry", "Symbol", "Term", "Dependencies", "CATALOGUE", "SYMBOLS", "TERMS",
    "DTYPE_ITEMSIZE", "DEFAULT_LIMITS", "symbols", "evaluate", "shape_of", "dependencies",
    "membership", "levers_of", "terms_of", "explain",
]

# The limits `metrale plan` and the generated docs use when none are given:
# (max_batch_tokens, max_seq_len, kv_block_size, max_batch_size).
DEFAULT_LIMITS = (8192, 4096, 16, 32)

# A catalogue entry is a buffer spec (name, holds, dtype, itemsize, dtype_note,
# shape, shape_exact, shape_when, formula, words, floor, families, empty, ...).
Entry = BufferSpec


class Dependencies(Record):
    """What a buffer's size is read from (see `dependencies`).

    Attributes
    ----------
    fields, limits, target, levers : tuple of str
        Config fields, sizing arguments, `Target` attributes and environment
        levers that its formula reads, directly or through derived symbols.
    """

    __slots__ = ("fields", "limits", "target", "levers")


CATALOGUE = {s.name: s for s in REFERENCE}
# Element sizes of the dtype names the reference buffers use (numpy / torch spelling).
DTYPE_ITEMSIZE = {s.dtype: s.itemsize for s in REFERENCE if s.dtype}

_SYMBOL_BY_NAME = {s.name: s for s in SYMBOLS}
_TERM_BY_NAME = {t.name: t for t in TERMS}


def symbols(config, max_batch_tokens, max_seq_len, kv_block_size, max_batch_size,
            target=None, env=None, *, tp_size=1):
    """The value of every symbol the formulas use.

    The input symbols (`SYMBOLS`) are read from the config fields, the limits,
    the target and the levers; the derived ones (`TERMS`) are evaluated from
    their documented expressions, in order; the long names of the inputs
    (`metrale.formulas.ALIASES`) follow.

    Parameters
    ----------
    config : ModelConfig
        The model shape.
    max_batch_tokens, max_seq_len, kv_block_size, max_batch_size : int
        The serving limits, as for `BufferSizes.from_config`.
    target : Target, optional
        The device sized for; None means ``Target.reference()``.
    env : mapping, optional
        Where the levers are read; None means ``os.environ``.
    tp_size : int, optional
        The tensor-parallel ranks `config` is one rank's shape of
        (``config`` already sharded, as ``BufferSizes.config`` is): symbol
        ``tp``, which ``Vg`` reads.  Default 1, the whole model.

    Returns
    -------
    dict
        Symbol name -> value (int, bool, str, or the tuple ``layer_types``).

    Raises
    ------
    TypeError
        If `config` is not a ModelConfig, `target` not a Target, `env` not a
        mapping, or a limit or `tp_size` not an int.
    ValueError
        If a limit is negative, `max_batch_tokens` or `tp_size` is 0.
    """
    from .sizes import check_index, sizing_inputs   # the sizing loads on first use: cheap
    tp = check_index(tp_size, "tp_size", 1)
    return values(config, *sizing_inputs(config, max_batch_tokens, max_seq_len, kv_block_size,
                                         max_batch_size, target, env), tp)


def _entry(name, buffers=None):
    buffers = buffer_set_arg(buffers)
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if name not in buffers:
        raise ValueError(buffers._unknown(name) + (
            "" if buffers is not REFERENCE else "; `metrale plan` lists the 46 buffers"))
    return buffers[name]


def evaluate(name, values, *, buffers=None):
    """Evaluate one buffer's formula.

    Parameters
    ----------
    name : str
        A buffer name.
    values : dict
        Symbol values, as `symbols` returns them.
    buffers : BufferSet, optional
        The set the buffer is in (None: `REFERENCE`).

    Returns
    -------
    int
        The buffer's size in bytes by its formula.

    Raises
    ------
    ValueError
        If `name` is not a buffer of the set.
    """
    return _evaluate(_entry(name, buffers).formula, values)


def shape_of(name, values, *, buffers=None):
    """One buffer's shape at the given symbol values, where it is exact.

    Parameters
    ----------
    name : str
        A buffer name.
    values : dict
        Symbol values, as `symbols` returns them.
    buffers : BufferSet, optional
        The set the buffer is in (None: `REFERENCE`).

    Returns
    -------
    tuple of int or None
        The shape (its product times `BufferSpec.itemsize` is the buffer's
        size, or less where a floor applies); None where the spec has no
        element type or no exact shape for these values (`shape_exact`,
        `shape_when`).

    Raises
    ------
    ValueError
        If `name` is not a buffer of the set.
    """
    entry = _entry(name, buffers)
    if entry.itemsize is None or not entry.shape_exact:
        return None
    if entry.shape_when is not None and not _evaluate(entry.shape_when, values):
        return None
    return tuple(int(d) for d in _evaluate(entry.shape, values))


def terms_of(name, *, buffers=None):
    """The derived symbols a buffer's formula reads, directly or indirectly.

    Parameters
    ----------
    name : str
        A buffer name.
    buffers : BufferSet, optional
        The set the buffer is in (None: `REFERENCE`).

    Returns
    -------
    tuple of str
        Names from `TERMS`, in `TERMS` order.

    Raises
    ------
    ValueError
        If `name` is not a buffer of the set.
    """
    return terms_used(_entry(name, buffers).formula)


def dependencies(name, *, buffers=None):
    """What a buffer's size is read from, found by reading its formula.

    Parameters
    ----------
    name : str
        A buffer name.
    buffers : BufferSet, optional
        The set the buffer is in (None: `REFERENCE`).

    Returns
    -------
    Dependencies
        The config fields, limits, target attributes and levers its formula
        reads, directly or through derived symbols, in `SYMBOLS` order.

    Raises
    ------
    ValueError
        If `name` is not a buffer of the set.
    """
    entry = _entry(name, buffers)
    exprs = [entry.formula] + [_TERM_BY_NAME[t].expr for t in terms_used(entry.formula)]
    read = set()
    for e in exprs:
        read |= {ALIASES.get(n, n) for n in _names(e)}
    parts = {"fields": [], "limits": [], "target": [], "levers": []}
    for s in SYMBOLS:
        if s.name in read:
            for key in parts:
                for x in getattr(s, key):
                    if x not in parts[key]:
                        parts[key].append(x)
    return Dependencies(**{k: tuple(x) for k, x in parts.items()})


def membership(name, *, buffers=None):
    """Which helpers cover a buffer, read from its spec.

    Parameters
    ----------
    name : str
        A buffer name.
    buffers : BufferSet, optional
        The set the buffer is in (None: `REFERENCE`).

    Returns
    -------
    dict
        ``zero_all`` (bool), ``zero_all_rows`` (``"trimmed"``, ``"whole"`` or
        None), ``zero_prefill_essentials`` (bool), ``checksum`` (bool),
        ``total`` (bool: counted by ``total_bytes()``), ``pointer`` and
        ``bytes`` (bool: the arena has ``arena.<name>()`` /
        ``arena.<name>_bytes()``).

    Raises
    ------
    ValueError
        If `name` is not a buffer of the set.
    """
    e = _entry(name, buffers)
    return {
        "zero_all": e.zero_all,
        # zero_all_rows covers the zero_all buffers: trims the token-major ones,
        # clears the rest whole.
        "zero_all_rows": ("trimmed" if e.rows != "whole" else "whole") if e.zero_all else None,
        "zero_prefill_essentials": e.prefill,
        "checksum": e.checksum,
        "total": e.total,
        "pointer": "pointer" in e.accessors,
        "bytes": "bytes" in e.accessors,
    }


def levers_of(name, *, buffers=None):
    """The environment levers that change a buffer's size.

    Parameters
    ----------
    name : str
        A buffer name.
    buffers : BufferSet, optional
        The set the buffer is in (None: `REFERENCE`).

    Returns
    -------
    tuple of str
        Lever names, in `metrale.levers.LEVERS` order: those whose symbols
        its formula reads.

    Raises
    ------
    ValueError
        If `name` is not a buffer of the set.
    """
    read = dependencies(name, buffers=buffers).levers
    return tuple(lv.name for lv in LEVERS if lv.name in read)


def _wrap(label, text, width=88):
    import textwrap
    pad = " " * 16
    return textwrap.fill(text, width, initial_indent=f"  {label:<14}", subsequent_indent=pad,
                         break_on_hyphens=False)


def explain(name, sizes=None, config=None, *, max_batch_tokens=None, max_seq_len=None,
            kv_block_size=None, max_batch_size=None, target=None, env=None, buffers=None):
    """The catalogue entry of one buffer, as text (``metrale plan --explain NAME``).

    Parameters
    ----------
    name : str
        A buffer name.
    sizes : BufferSizes, optional
        Sizes to report the buffer's actual byte count from.
    config : ModelConfig, optional
        A model: the formula is then also shown evaluated, with its symbols'
        values, for the limits below (and for ``sizes.limits.tp_size``
        ranks when `sizes` has limits: `config` is then one rank's shape).
    max_batch_tokens, max_seq_len, kv_block_size, max_batch_size : int, optional
        The limits the formula is evaluated for; each defaults to its value in
        `DEFAULT_LIMITS` (8192, 4096, 16, 32), as ``metrale plan`` does.
    target : Target, optional
        The device sized for; None means ``Target.reference()``.
    env : mapping, optional
        Where the levers are read; None means ``os.environ``.
    buffers : BufferSet, optional
        The set the buffer is in: None means ``sizes.buffers`` when `sizes`
        is given, else `REFERENCE`.

    Returns
    -------
    str
        Several lines, ending with a newline.

    Raises
    ------
    ValueError
        If `name` is not a buffer of the set (the message names it), or a
        limit is out of range.
    TypeError
        If `name` is not a str, `sizes` not a BufferSizes, `config` not a
        ModelConfig or `buffers` not a BufferSet.
    """
    from .sizes import BufferSizes
    if sizes is not None:
        if not isinstance(sizes, BufferSizes):
            raise TypeError(f"sizes must be a BufferSizes or None, got {type(sizes).__name__}")
        if buffers is None:
            buffers = sizes.buffers
    buffers = buffer_set_arg(buffers)
    e = _entry(name, buffers)
    i = buffers.index(name)
    doc = f"docs/buffers.md#{name}" if buffers is REFERENCE else "an engine's own set"
    lines = [f"{name}  (buffer {i + 1} of {len(buffers)}; {doc})"]
    add = lines.append
    add(_wrap("holds:", e.holds or "(not described)"))
    element = e.dtype if e.dtype else (f"{e.itemsize}-byte words" if e.itemsize else "mixed")
    add(_wrap("element:", element + (f" ({e.dtype_note})" if e.dtype_note else "")))
    add(_wrap("shape:", (e.shape or "(none given)")
              + (f"  (when {e.shape_when})" if e.shape_when else "")))
    if e.words:
        add(_wrap("size:", e.words))
    vals = lim = None
    if config is not None:
        lim = tuple(DEFAULT_LIMITS[j] if x is None else x for j, x in enumerate(
            (max_batch_tokens, max_seq_len, kv_block_size, max_batch_size)))
        tp = sizes.limits.tp_size if sizes is not None and sizes.limits is not None else 1
        vals = symbols(config, *lim, target=target, env=env, tp_size=tp)
    formula, evaluated = explanation(e.formula, vals)
    lines.extend(_wrap(label, text) for label, text in formula)
    m = membership(name, buffers=buffers)
    zeroed = [h for h, on in (("zero_all", m["zero_all"]),
                              (f"zero_all_rows ({ROW_WORDS[e.rows]})", m["zero_all_rows"]),
                              ("zero_prefill_essentials", m["zero_prefill_essentials"])) if on]
    add(_wrap("zeroed by:", ", ".join(zeroed) or "never (no helper writes it)"))
    add(_wrap("checksum:", "probed by debug_buffer_checksum" if m["checksum"] else "not probed"))
    add(_wrap("total_bytes:", "counted" if m["total"] else "not counted"))
    acc = [f"arena.{name}()" if m["pointer"] else "", f"arena.{name}_bytes()" if m["bytes"] else ""]
    add(_wrap("accessors:", ", ".join(a for a in acc if a)
              or f"arena.ptr({name!r}), arena.ptrs.{name}"))
    if e.align != 256:
        add(_wrap("alignment:", f"{e.align} bytes"))
    d = dependencies(name, buffers=buffers)
    add(_wrap("levers:", ", ".join(levers_of(name, buffers=buffers)) or "none"))
    add(_wrap("config:", ", ".join(d.fields) or "none"))
    if e.families:
        add(_wrap("families:", e.families))
    if buffers is REFERENCE or e.empty:
        add(_wrap("can be empty:", e.empty or "no, not for a real model"))
    if config is not None:
        add(f"  evaluated for max_batch_tokens={lim[0]} max_seq_len={lim[1]} "
            f"kv_block_size={lim[2]} max_batch_size={lim[3]}:")
        lines.extend(_wrap("", text) for text in evaluated)
        if sizes is None:
            sizes = BufferSizes.from_config(config, *lim, target=target, env=env, buffers=buffers)
            add(_wrap("from_config:", f"{sizes[name]:,} bytes"))
        else:
            actual = sizes[name]
            add(_wrap("in sizes:", f"{actual:,} bytes" + (
                "" if actual == evaluate(name, vals, buffers=buffers) else "  (differs: the sizes were built for other limits, "
                "target or levers, or replaced)")))
    elif sizes is not None:
        add(_wrap("in sizes:", f"{sizes[name]:,} bytes"))
    return "\n".join(lines) + "\n"
