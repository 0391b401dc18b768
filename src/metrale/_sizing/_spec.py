"""A buffer spec: one buffer of a set (`BufferSpec`, published as
``metrale.buffers.BufferSpec``) and the rules it must follow, checked when it
is made: each field's type and range, and what the fields must agree on.
Every refusal names the spec and the field.  Pure Python: it loads
`metrale.formulas` and the reference table's data (which buffers have
compiled accessors).
"""


import ast
import warnings

from . import formulas
from .._base._record import Record
from ._reference_table import RECORDS
from .._base._dtypes import ITEMSIZE
from .._base._math import U64_MAX
from ._wake import DEFAULT_TAG, check_tag, check_wake
from ._step_roles import (STEP_FILL_NAMES, STEP_IDS, STEP_META, STEP_ROLES, check_step,
                          check_step_roles, default_step)

__all__ = ["BufferSpec", "POOL_NAME", "ROW_RULES", "ACCESSORS", "MAX_BUFFERS", "MAX_ZERO_ALL",
           "STEP_IDS", "STEP_META", "STEP_ROLES", "STEP_FILL_NAMES", "RESERVED_NAMES", "check_spec",
           "check_step_roles", "dims_of"]

# zero_all_rows rules: "whole" (cleared whole), "M" (rows of max_batch_tokens),
# "Mp" (rows of ceil16(max_batch_tokens): GEMM-tiled buffers), "M|Mp" (a size
# that is the larger of layouts in either: the live part of each), "auto" (the
# old divisibility guess, deprecated: trimmed as "M|Mp").
ROW_RULES = ("whole", "M", "Mp", "M|Mp", "auto")
# What zero_all_rows(tokens) clears of a buffer of each rule, in words (the
# catalogue's pages and `metrale plan --explain` say it so).
ROW_WORDS = {"whole": "cleared whole", "M": "trimmed to tokens rows of M",
             "Mp": "trimmed to ceil16(tokens) rows of Mp",
             "M|Mp": "trimmed to the larger of tokens rows of M and ceil16(tokens) of Mp",
             "auto": "trimmed as M|Mp (rows='auto', deprecated)"}
# The accessors the arena class has compiled in, for the reference buffers.
ACCESSORS = ("pointer", "bytes")
# The C core's limits (arena_core.h MT_MAX_BUFFERS; kernels/zero_ranges.h
# MT_MAX_ROWS_ENTRIES - 1: zero_all_rows clears its buffers in one launch whose
# parameter block holds one entry per buffer, plus one a hole may split off).
MAX_BUFFERS = 256
MAX_ZERO_ALL = 30
_MIN_ALIGN, _MAX_ALIGN = 256, 1 << 30
_MAX_NAME = 64
# The accessors the arena compiles (tools/gen_buffers.py), by reference buffer.
_COMPILED = {r["name"]: r["accessors"] for r in RECORDS}
# The name `BufferArena.sleep(offload=...)` gives the arena's pool (the
# memory torch allocates in it, docs/torch.md): no buffer may have it.
POOL_NAME = "torch"
# Names a buffer cannot have: BufferSizes' attributes and methods.
RESERVED_NAMES = frozenset({
    "buffers", "limits", "levers", "config", "target", "from_config", "total_bytes", "as_dict",
    "as_tuple", "replace", "keys", "items", "values", "get",
})


def _bool(value, where):
    if type(value) is not bool:
        raise TypeError(f"{where} must be a bool, got {type(value).__name__}")
    return value


def _int(value, where, lo, hi=U64_MAX):
    if type(value) is not int:
        raise TypeError(f"{where} must be an int, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{where} must be in {lo} .. {hi}, got {value}")
    return value


def dims_of(text):
    """The dimension expressions of an exact shape's list text.

    Parameters
    ----------
    text : str
        A list expression (``"[M, 2*D]"``).

    Returns
    -------
    tuple of str
        Each dimension's expression.

    Raises
    ------
    SyntaxError, ValueError
        `text` is not a list expression.
    """
    tree = ast.parse(text.strip(), mode="eval").body
    if not isinstance(tree, ast.List):
        raise ValueError("not a list")
    return tuple(ast.unparse(e) for e in tree.elts)


def _simple(expr):
    return expr.isidentifier() or expr.isdigit()


def _reads(names):
    """Every symbol read through `names`, derived symbols expanded."""
    terms = {t.name: t for t in formulas.TERMS}
    seen, todo = set(), [formulas.ALIASES.get(n, n) for n in names]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in terms:
            todo.extend(formulas.ALIASES.get(x, x) for x in formulas.names_of(terms[n].expr))
    return seen


def check_spec(name, dtype, shape, size, itemsize, floor, zero_all, prefill, rows, checksum,
             total, align, accessors, init_zero, shape_exact, shape_when, text, step=None,
               wake="zero", tag=DEFAULT_TAG):
    """Check `BufferSpec`'s arguments and give its stored fields.

    Parameters
    ----------
    name, dtype, shape, size, itemsize, floor, zero_all, prefill, rows, checksum, total, align, accessors, init_zero, shape_exact, shape_when, wake, tag : object
        As `BufferSpec` takes them.
    text : dict of str to str
        The catalogue text fields (holds, words, dtype_note, families, empty).
    step : str or None
        As `BufferSpec` takes it.

    Returns
    -------
    dict
        Every slot of `BufferSpec`: the fields checked and derived
        (`itemsize` from `dtype`, `formula` from `size` or the shape).

    Raises
    ------
    TypeError, ValueError
        As `BufferSpec`.
    """
    if not isinstance(name, str):
        raise TypeError(f"buffer spec name must be a str, got {type(name).__name__}")
    if not formulas.is_name(name) or name.startswith("_") or len(name) > _MAX_NAME:
        raise ValueError(f"buffer spec {name!r}: name must be a Python identifier in ASCII "
                         "(Python folds other letters: arena.ptrs.\uff4cogits reads logits), "
                         f"of at most {_MAX_NAME} characters, not a keyword and not starting "
                         "with '_'")
    where = f"buffer spec {name!r}"
    if name in RESERVED_NAMES:
        raise ValueError(f"{where}: name is reserved (a BufferSizes attribute): "
                         + ", ".join(sorted(RESERVED_NAMES)))
    if name == POOL_NAME:
        raise ValueError(f"{where}: name is reserved: sleep(offload=[{POOL_NAME!r}]) names the "
                         "arena's pool (docs/torch.md)")
    if dtype is not None:
        if not isinstance(dtype, str):
            raise TypeError(f"{where}: dtype must be a str or None, got {type(dtype).__name__}")
        if dtype not in ITEMSIZE:
            raise ValueError(f"{where}: dtype: unknown element type {dtype!r}; one of "
                             + ", ".join(ITEMSIZE))
    if itemsize is not None:
        _int(itemsize, f"{where}: itemsize", 1, 16)
        if itemsize not in (1, 2, 4, 8, 16):
            raise ValueError(f"{where}: itemsize must be 1, 2, 4, 8 or 16, got {itemsize}")
        if dtype is not None and itemsize != ITEMSIZE[dtype]:
            raise ValueError(f"{where}: itemsize {itemsize} disagrees with dtype {dtype} "
                             f"({ITEMSIZE[dtype]} bytes)")
    elif dtype is not None:
        itemsize = ITEMSIZE[dtype]
    read = set()
    # shape: a sequence of dimensions (exact), or a description
    dims = None
    if shape is None:
        text_shape, exact = "", False
        if shape_exact:
            raise ValueError(f"{where}: shape_exact without a shape")
    elif isinstance(shape, str):
        text_shape = shape
        exact = bool(_bool(shape_exact, f"{where}: shape_exact")) if shape_exact is not None \
            else False
        if exact:
            try:
                dims = dims_of(shape)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                raise ValueError(f"{where}: shape: an exact shape is a list expression "
                                 f"such as '[M, H]', got {shape!r}") from None
    elif isinstance(shape, (list, tuple)):
        if shape_exact is not None and not shape_exact:
            raise ValueError(f"{where}: shape_exact=False with a sequence shape")
        dims = []
        for i, d in enumerate(shape):
            if type(d) is int:
                if d < 1:
                    raise ValueError(f"{where}: shape[{i}]: a dimension must be >= 1 (a "
                                     f"zero or negative width), got {d}")
                _int(d, f"{where}: shape[{i}]", 1)
                dims.append(str(d))
            elif isinstance(d, str):
                dims.append(d.strip())
            else:
                raise TypeError(f"{where}: shape[{i}] must be an int or a str expression, "
                                f"got {type(d).__name__}")
        if not dims:
            raise ValueError(f"{where}: shape: no dimensions (a scalar buffer is shape [1])")
        exact = True            # text_shape: from the checked dims, below
    else:
        raise TypeError(f"{where}: shape must be a sequence of dimensions or a str, got "
                        f"{type(shape).__name__}")
    if dims is not None:
        for i, d in enumerate(dims):
            # Every dimension is checked as an expression: text that only
            # looks like digits ("007", "²") would pass and fail at sizing
            # with a SyntaxError.  One that reads no symbol is a constant,
            # refused unless >= 1 ("0" is a zero-width dimension).
            names = formulas.check(d, f"{where}: shape[{i}]")
            read |= names
            if not names:
                try:
                    value = formulas.evaluate(d, {})
                except ArithmeticError as e:
                    raise ValueError(f"{where}: shape[{i}]: {d!r} fails: {e}") from None
                if type(value) is not int or value < 1:
                    raise ValueError(f"{where}: shape[{i}]: a dimension must be >= 1 (a zero "
                                     f"or negative width), got {d!r} = {value!r}")
        # Each dimension as dims_of reads it back from the shape text (replace,
        # to_dict): written "(M + 1)" it would come back "M + 1", another
        # formula text and so another fingerprint for the same buffer.
        dims = dims_of("[" + ", ".join(dims) + "]")
        if not isinstance(shape, str):
            text_shape = "[" + ", ".join(dims) + "]"
    if shape_when is not None:
        formulas.check(shape_when, f"{where}: shape_when")
    if floor is not None:
        _int(floor, f"{where}: floor", 0)
    # size: the formula, given or from the shape
    if size is None:
        if dims is None:
            raise ValueError(f"{where}: size: give size= (bytes, or an expression), or a "
                             "sequence shape")
        if itemsize is None:
            raise ValueError(f"{where}: itemsize: a shape-sized buffer needs a dtype or an "
                             "itemsize")
        formula = "*".join([str(itemsize)] + [d if _simple(d) else f"({d})" for d in dims])
        if floor:
            formula = f"max({formula}, {floor})"
    elif type(size) is int:
        _int(size, f"{where}: size", 0)
        formula = size = str(size)
    elif isinstance(size, str):
        read |= formulas.check(size, f"{where}: size")
        formula = size = size.strip()
    else:
        raise TypeError(f"{where}: size must be a str expression or an int, got "
                        f"{type(size).__name__}")
    zero_all = _bool(zero_all, f"{where}: zero_all")
    prefill = _bool(prefill, f"{where}: prefill")
    checksum = _bool(checksum, f"{where}: checksum")
    total = _bool(total, f"{where}: total")
    init_zero = _bool(init_zero, f"{where}: init_zero")
    if prefill and not zero_all:
        raise ValueError(f"{where}: prefill: a zero_prefill_essentials buffer is also cleared "
                         "by zero_all; set zero_all=True")
    if not isinstance(rows, str):
        raise TypeError(f"{where}: rows must be a str, got {type(rows).__name__}")
    if rows not in ROW_RULES:
        raise ValueError(f"{where}: rows must be one of {', '.join(ROW_RULES)}, got {rows!r}")
    if rows == "auto":
        warnings.warn(f"{where}: rows='auto' is deprecated: it guessed the row count from the "
                      "size; write rows='M' (rows of max_batch_tokens), 'Mp' (rows of "
                      "ceil16(max_batch_tokens)) or 'M|Mp' (a size that is the larger of "
                      "both; 'auto' is now trimmed so)", DeprecationWarning, stacklevel=3)
    if rows != "whole":
        if not zero_all:
            raise ValueError(f"{where}: rows={rows!r}: zero_all_rows trims only zero_all "
                             "buffers; set zero_all=True or rows='whole'")
        if "M" not in _reads(read):
            raise ValueError(f"{where}: rows={rows!r}: its size has no token dimension (it "
                             "does not read max_batch_tokens), so it has no rows to trim")
    _int(align, f"{where}: align", _MIN_ALIGN, _MAX_ALIGN)
    if align & (align - 1):
        raise ValueError(f"{where}: align must be a power of two, got {align}")
    if isinstance(accessors, str) or not isinstance(accessors, (list, tuple)):
        raise TypeError(f"{where}: accessors must be a sequence of str, got "
                        f"{type(accessors).__name__}")
    for a in accessors:
        if a not in ACCESSORS:
            raise ValueError(f"{where}: accessors: {a!r} is not one of {', '.join(ACCESSORS)}")
    accessors = tuple(a for a in ACCESSORS if a in accessors)
    if accessors:
        have = _COMPILED.get(name, ())
        missing = [a for a in accessors if a not in have]
        if missing:
            raise ValueError(f"{where}: accessors: the arena has compiled accessors for the "
                             f"reference buffers only (none {missing[0]!r} for {name!r}); "
                             f"use arena.ptr({name!r}) or arena.ptrs.{name}")
    for k, v in text.items():
        if not isinstance(v, str):
            raise TypeError(f"{where}: {k} must be a str, got {type(v).__name__}")
    step = check_step(where, name, step, dtype, zero_all, rows, align)
    wake = check_wake(where, wake, dtype, init_zero)
    tag = check_tag(where, tag, POOL_NAME)
    return dict(wake=wake, tag=tag, name=name, dtype=dtype, itemsize=itemsize, shape=text_shape, shape_exact=exact,
                shape_when=shape_when, size=size, formula=formula, floor=floor,
                zero_all=zero_all, prefill=prefill, rows=rows, checksum=checksum, total=total,
                align=align, accessors=accessors, init_zero=init_zero, step=step, **text)


_TEXT = ("holds", "words", "dtype_note", "families", "empty")


class BufferSpec(Record):
    """One buffer of a set: what it is, how big, and what covers it.

    Give the size as a `shape` (its product times the element size, at least
    `floor`) or as a `size` formula; both are written over the symbols of
    docs/buffers.md (``M``, ``H``, ...) or their long names
    (``max_batch_tokens``, ``hidden_size``, ...), checked now.

    Parameters
    ----------
    name : str
        A Python identifier (no leading underscore, at most 64 characters,
        not one of `RESERVED_NAMES`).
    dtype : str, optional
        The element type (``"bfloat16"``, ``"float32"``, ...: the names
        ``arena.view`` takes), or None for raw bytes.  Views of the buffer
        default to it; debug arenas poison and scan it by it.
    shape : sequence or str, optional
        A sequence of dimensions, each an int >= 1 or an expression
        (``["max_batch_tokens", "hidden_size"]``): exact, views default to
        it, and without `size` it gives the size.  A str is a description
        only (unless `shape_exact`: then a list expression).
    size : str or int, keyword-only, optional
        The byte size: an expression, or a constant.  Required without a
        sequence `shape`.
    itemsize : int, optional
        Bytes per element (1, 2, 4, 8 or 16): the dtype's, or for raw bytes
        the width a shape counts in.
    floor : int, optional
        The least bytes of a shape-sized buffer (``max(product, floor)``); with
        `size` it only documents the floor the formula applies.
    zero_all, prefill, checksum : bool, optional
        Cleared by ``zero_all``; by ``zero_prefill_essentials`` (implies
        `zero_all`); probed by ``debug_buffer_checksum``.
    rows : str, optional
        How ``zero_all_rows`` trims it: ``"whole"`` (default), ``"M"`` (the
        first `tokens` rows of max_batch_tokens), ``"Mp"`` (the first
        ceil16(`tokens`) rows of ceil16(max_batch_tokens), GEMM-tiled; for
        either, a size the rows do not divide is cleared whole) or ``"M|Mp"``
        (a size that is the larger of layouts in both, such as
        ``max(2*Mp*X, 2*M*Y)``: the larger live part, rows rounded up).
        ``"auto"``, the old divisibility guess, is deprecated: it warns and
        is trimmed as ``"M|Mp"``.  Only for a `zero_all` buffer whose size
        reads max_batch_tokens.
    total : bool, optional
        Counted by ``BufferSizes.total_bytes()`` (default True).
    align : int, optional
        Alignment of its start in the slab: a power of two, 256 .. 2**30.
    accessors : sequence of str, optional
        ``"pointer"`` / ``"bytes"``: the compiled ``arena.NAME()`` /
        ``arena.NAME_bytes()`` accessors, which exist for the reference
        buffers only (any buffer has ``arena.ptr(NAME)`` and ``arena.ptrs.NAME``).
    init_zero : bool, optional
        Zero-filled once when the arena is built (and when it wakes).
    wake : str, optional
        Its wake contract: what ``BufferArena.wake`` gives it after a sleep
        (docs/stable-addresses.md).  ``"zero"`` (the default): zeros;
        ``"keep"``: its bytes, through a pinned host copy; ``"offload"``:
        its bytes, and readable at its address while the arena sleeps;
        ``"fill:VALUE"``: VALUE in every element (of its `dtype`, rounded
        to the nearest value of the type; a fill buffer is also filled when
        the arena is built and when a resize grows it: an init-once
        constant); ``"undefined"``: whatever the new memory holds (it must
        be written before it is read).  ``sleep()`` applies it; its `keep`,
        `offload` and `discard` override it for one sleep.
    tag : str, optional
        Its class (``"weights"``, ``"kv"``, ...; default ``"default"``):
        ``arena.guard`` names classes, and each class's wakes are counted
        (its epoch).  At most 63 classes in a set; ``"torch"`` is the
        pool's.
    shape_exact : bool, optional
        For a str `shape`: it is a list expression of exact dimensions.
    shape_when : str, optional
        A condition under which the shape is exact (None: always).
    step : str, optional
        What it holds of the inputs an engine uploads every step
        (`StepInputs`, docs/step-inputs.md): ``"token_ids"``, ``"count"``
        (the int32 token count), ``"positions"``, ``"metadata"`` (anything
        else, filled by the buffer's name) or ``"decode_meta"`` (the
        reference's scratch); ``""`` for none.  None (the default) follows
        the name: ``token_ids`` holds the token ids and ``scratch`` the
        decode metadata, as in the reference set.  The slab places these
        buffers first, back to back, so one upload reaches them all.
    holds, words, dtype_note, families, empty : str, optional
        Catalogue text: what it holds, its size in words, what else its
        bytes are, which models size it, why it can be empty.

    Attributes
    ----------
    name, dtype, itemsize, floor, zero_all, prefill, rows, checksum, total, align, init_zero, wake, tag : object
        As given, with the types of the Parameters (`itemsize` filled in
        from `dtype`).
    shape : str
        The shape as text (``"[max_batch_tokens, hidden_size]"``), or "".
    shape_exact : bool
        Whether `shape` is a list expression of the exact dimensions.
    shape_when : str or None
        As given.
    size : str or None
        The size expression as given (a constant as its digits); None when
        the shape gives the size.
    formula : str
        The byte size as an expression over the symbols: `size`, or the
        shape's product times `itemsize` (at least `floor`).
    accessors : tuple of str
        As given, in the order of `ACCESSORS`.
    step : str
        Its step role, or "" (None given: the one its name gives).
    holds, words, dtype_note, families, empty : str
        As given.

    Raises
    ------
    TypeError
        A field of the wrong type (named).
    ValueError
        A field out of range or inconsistent (named, with the spec's name).
    """

    __slots__ = ("name", "dtype", "itemsize", "shape", "shape_exact", "shape_when", "size",
                 "formula", "floor", "zero_all", "prefill", "rows", "checksum", "total",
                 "align", "accessors", "init_zero", "step", "holds", "words", "dtype_note",
                 "families", "empty", "wake", "tag")

    def __init__(self, name, dtype=None, shape=None, *, size=None, itemsize=None, floor=None,
                 zero_all=False, prefill=False, rows="whole", checksum=False, total=True,
                 align=256, accessors=(), init_zero=False, shape_exact=None, shape_when=None,
                 step=None, holds="", words="", dtype_note="", families="", empty="",
                 wake="zero", tag=DEFAULT_TAG):
        fields = check_spec(name, dtype, shape, size, itemsize, floor, zero_all, prefill, rows,
                          checksum, total, align, accessors, init_zero, shape_exact,
                          shape_when, dict(holds=holds, words=words, dtype_note=dtype_note,
                                           families=families, empty=empty), step, wake,
                            tag)
        for k in self.__slots__:
            object.__setattr__(self, k, fields[k])

    @classmethod
    def _trusted(cls, **fields):
        """A spec from stored fields, unchecked: for metrale/_sizing/_reference_table.py, whose
        specs the tests check through the constructor."""
        self = object.__new__(cls)
        for k in cls.__slots__:
            object.__setattr__(self, k, fields[k])
        return self

    def _arguments(self):
        """The constructor arguments that make this spec."""
        out = {k: getattr(self, k) for k in self.__slots__ if k != "formula"}
        if self.dtype is not None:
            out["itemsize"] = None          # the dtype's: follows a changed dtype
        if self.shape_exact and self.size is None:
            out["shape"] = list(dims_of(self.shape))
            out["shape_exact"] = None
        if self.step == default_step(self.name):
            out["step"] = None              # the name's: follows a changed name
        return out

    def replace(self, **changes):
        """A copy with some fields changed, checked as a new spec.

        Parameters
        ----------
        **changes
            Constructor arguments (``size="4*M*H"``, ``zero_all=True``, ...).
            A spec sized by its shape is sized again from the new shape.

        Returns
        -------
        BufferSpec

        Raises
        ------
        TypeError, ValueError
            As the constructor; or an unknown field.
        """
        args = self._arguments()
        for k in changes:
            if k not in args or k == "formula":
                raise TypeError(f"BufferSpec.replace: unknown field {k!r}")
        args.update(changes)
        if "shape" in changes and "shape_exact" not in changes:
            args["shape_exact"] = None
        name = args.pop("name")
        return BufferSpec(name, **args)

    def to_dict(self):
        """The spec as plain data (str, int, bool, list), as a buffers file holds it.

        Returns
        -------
        dict
            The constructor arguments that differ from their defaults.
        """
        out = {"name": self.name}
        for k, v in self._arguments().items():
            if k != "name" and v != _DEFAULTS[k]:
                out[k] = list(v) if isinstance(v, tuple) else v
        return out

    def __reduce__(self):
        return (_restore, (tuple(getattr(self, k) for k in self.__slots__),))

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()
                         if k not in _TEXT)
        return f"BufferSpec({args})"


def _restore(values):
    return BufferSpec._trusted(**dict(zip(BufferSpec.__slots__, values)))


_DEFAULTS = dict(dtype=None, shape=None, size=None, itemsize=None, floor=None, zero_all=False,
                 prefill=False, rows="whole", checksum=False, total=True, align=256,
                 accessors=(), init_zero=False, shape_exact=None, shape_when=None, step=None,
                 holds="", words="", dtype_note="", families="", empty="", wake="zero",
                 tag=DEFAULT_TAG)
