"""The rules a buffer spec must follow, checked when it is made
(`metrale.buffers.BufferSpec`): each field's type and range, and what the
fields must agree on.  Every refusal names the spec and the field.  Pure
Python: it loads `metrale.formulas` and nothing else.
"""

from . import formulas
from ._dtypes import ITEMSIZE
from ._math import U64_MAX

# zero_all_rows rules: "whole" (cleared whole), "M" (rows of max_batch_tokens),
# "Mp" (rows of ceil16(max_batch_tokens): GEMM-tiled buffers), "auto" (either,
# told apart by the size's divisibility: ARENA.md 5.2, the reference rule).
ROW_RULES = ("whole", "M", "Mp", "auto")
# The accessors the arena class has compiled in, for the reference buffers.
ACCESSORS = ("pointer", "bytes")
# The C core's limits (arena_core.h MT_MAX_BUFFERS; kernels/zero_ranges.h
# MT_MAX_ROWS_ENTRIES - 1: zero_all_rows clears its buffers in one launch whose
# parameter block holds one entry per buffer, plus one a hole may split off).
MAX_BUFFERS = 256
MAX_ZERO_ALL = 30
_MIN_ALIGN, _MAX_ALIGN = 256, 1 << 30
_MAX_NAME = 64
# The step inputs (StepInputs): token ids, then the byte scratch whose front
# holds the token count and the decode metadata; one upload reaches both.
STEP_IDS, STEP_META = "token_ids", "scratch"
# Names a buffer cannot have: BufferSizes' attributes and methods.
RESERVED_NAMES = frozenset({
    "buffers", "limits", "levers", "from_config", "total_bytes", "as_dict", "as_tuple",
    "replace", "keys", "items", "values", "get",
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
    import ast
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
             total, align, accessors, init_zero, shape_exact, shape_when, text):
    """Check `BufferSpec`'s arguments and give its stored fields.

    Parameters
    ----------
    name, dtype, shape, size, itemsize, floor, zero_all, prefill, rows, checksum, total, align, accessors, init_zero, shape_exact, shape_when : object
        As `BufferSpec` takes them.
    text : dict of str to str
        The catalogue text fields (holds, words, dtype_note, families, empty).

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
        ref = _reference()
        have = ref[name].accessors if name in ref else ()
        missing = [a for a in accessors if a not in have]
        if missing:
            raise ValueError(f"{where}: accessors: the arena has compiled accessors for the "
                             f"reference buffers only (none {missing[0]!r} for {name!r}); "
                             f"use arena.ptr({name!r}) or arena.ptrs.{name}")
    for k, v in text.items():
        if not isinstance(v, str):
            raise TypeError(f"{where}: {k} must be a str, got {type(v).__name__}")
    return dict(name=name, dtype=dtype, itemsize=itemsize, shape=text_shape, shape_exact=exact,
                shape_when=shape_when, size=size, formula=formula, floor=floor,
                zero_all=zero_all, prefill=prefill, rows=rows, checksum=checksum, total=total,
                align=align, accessors=accessors, init_zero=init_zero, **text)


def _reference():
    from .reference import REFERENCE
    return REFERENCE
