"""Buffer sets: the buffers an engine's arena holds, declared as data.

A `BufferSpec` declares one buffer: its name, element type, size (a shape in
terms of the limits and the model config, or a formula in the language of
`metrale.formulas`), which helpers cover it (``zero_all``,
``zero_prefill_essentials``, the row rule of ``zero_all_rows``, the
checksum), its alignment and what the catalogue says about it.  A `BufferSet`
is an ordered, immutable collection of specs; `REFERENCE` is the reference
engine's 46 (metrale/reference.py, the one place they are written), and an
engine derives its own from it (`BufferSet.without`, `BufferSet.with_`,
`BufferSet.replace`) or builds one from scratch.  (``metrale.REFERENCE``
is ``metrale.reference.REFERENCE``.)  docs/buffer-sets.md has a
worked example.

Every spec is checked when it is made and every set when it is built, so a
bad declaration raises ``ValueError`` naming the spec and the field before
anything is sized or allocated.  Pure Python: importing this module loads
nothing else.
"""

import hashlib
import json

from ._record import Record

__all__ = ["BufferSpec", "BufferSet", "ROW_RULES", "ACCESSORS", "MAX_BUFFERS",
           "MAX_ZERO_ALL", "RESERVED_NAMES"]

from ._spec_rules import (ACCESSORS, MAX_BUFFERS, MAX_ZERO_ALL, RESERVED_NAMES, ROW_RULES,
                          STEP_IDS, STEP_META, check_spec, dims_of)

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
        ceil16(`tokens`) rows of ceil16(max_batch_tokens), GEMM-tiled) or
        ``"auto"`` (either, by the size's divisibility, the reference rule);
        a size that the rows do not divide is cleared whole.  Only for a
        `zero_all` buffer whose size reads max_batch_tokens.
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
    shape_exact : bool, optional
        For a str `shape`: it is a list expression of exact dimensions.
    shape_when : str, optional
        A condition under which the shape is exact (None: always).
    holds, words, dtype_note, families, empty : str, optional
        Catalogue text: what it holds, its size in words, what else its
        bytes are, which models size it, why it can be empty.

    Attributes
    ----------
    name, dtype, itemsize, floor, zero_all, prefill, rows, checksum, total, align, init_zero : object
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
                 "align", "accessors", "init_zero", "holds", "words", "dtype_note", "families",
                 "empty")

    def __init__(self, name, dtype=None, shape=None, *, size=None, itemsize=None, floor=None,
                 zero_all=False, prefill=False, rows="whole", checksum=False, total=True,
                 align=256, accessors=(), init_zero=False, shape_exact=None, shape_when=None,
                 holds="", words="", dtype_note="", families="", empty=""):
        fields = check_spec(name, dtype, shape, size, itemsize, floor, zero_all, prefill, rows,
                          checksum, total, align, accessors, init_zero, shape_exact,
                          shape_when, dict(holds=holds, words=words, dtype_note=dtype_note,
                                           families=families, empty=empty))
        for k in self.__slots__:
            object.__setattr__(self, k, fields[k])

    @classmethod
    def _trusted(cls, **fields):
        """A spec from stored fields, unchecked: for metrale/reference.py, whose
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
                 accessors=(), init_zero=False, shape_exact=None, shape_when=None, holds="",
                 words="", dtype_note="", families="", empty="")


# The groups of a set: which helper or property covers which buffers.
_GROUPS = {
    "zero_all": lambda s: s.zero_all,
    "prefill": lambda s: s.prefill,
    "rows": lambda s: s.rows != "whole",
    "checksum": lambda s: s.checksum,
    "total": lambda s: s.total,
    "pointer": lambda s: "pointer" in s.accessors,
    "bytes": lambda s: "bytes" in s.accessors,
    "init_zero": lambda s: s.init_zero,
    "step": lambda s: s.name in (STEP_IDS, STEP_META),
}


class BufferSet:
    """An ordered, immutable set of buffer specs: what an arena holds.

    The order is the canonical order (of `BufferSizes`, the summaries and
    the docs); the slab places the buffers by helper (docs/buffer-sets.md).
    Sets compare and hash by their specs.

    Parameters
    ----------
    specs : iterable of BufferSpec
        The buffers, in order.

    Raises
    ------
    TypeError
        An item is not a BufferSpec.
    ValueError
        Two specs share a name; more than 256 buffers; more than 30 in
        ``zero_all`` (``zero_all_rows`` clears them in one launch); or
        ``token_ids`` covered by a zeroing helper (the step inputs upload it
        every step).
    """

    __slots__ = ("_specs", "_index", "_cache", "__weakref__")

    def __init__(self, specs=()):
        if isinstance(specs, (str, bytes, BufferSpec)):
            raise TypeError(f"specs must be an iterable of BufferSpec, got {type(specs).__name__}")
        specs = tuple(specs)
        index = {}
        for i, s in enumerate(specs):
            if not isinstance(s, BufferSpec):
                raise TypeError(f"specs[{i}] must be a BufferSpec, got {type(s).__name__}")
            if s.name in index:
                raise ValueError(f"buffer spec {s.name!r}: name: given twice (specs[{index[s.name]}] "
                                 f"and specs[{i}])")
            index[s.name] = i
        if len(specs) > MAX_BUFFERS:
            raise ValueError(f"a buffer set holds at most {MAX_BUFFERS} buffers, got {len(specs)}")
        z = sum(1 for s in specs if s.zero_all)
        if z > MAX_ZERO_ALL:
            raise ValueError(f"at most {MAX_ZERO_ALL} buffers may be zero_all (zero_all_rows "
                             f"clears them with one kernel launch), got {z}")
        ids = index.get(STEP_IDS)
        if ids is not None and (specs[ids].zero_all or specs[ids].rows != "whole"):
            raise ValueError(f"buffer spec {STEP_IDS!r}: zero_all: the step inputs upload the "
                             "token ids every step, before the zeroing; a helper would erase them")
        for name in (STEP_IDS, STEP_META):
            if name in index and specs[index[name]].align != 256:
                raise ValueError(f"buffer spec {name!r}: align: the step inputs' buffers sit "
                                 "back to back (one upload reaches both): 256 only")
        object.__setattr__(self, "_specs", specs)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_cache", {})

    @classmethod
    def _trusted(cls, specs):
        self = object.__new__(cls)
        object.__setattr__(self, "_specs", tuple(specs))
        object.__setattr__(self, "_index", {s.name: i for i, s in enumerate(specs)})
        object.__setattr__(self, "_cache", {})
        return self

    def __setattr__(self, name, value):
        raise AttributeError("BufferSet is read-only")

    def __delattr__(self, name):
        raise AttributeError("BufferSet is read-only")

    # -- the collection ---------------------------------------------------------------
    @property
    def names(self):
        """The buffer names in order (tuple of str)."""
        names = self._cache.get("names")
        if names is None:
            names = self._cache["names"] = tuple(s.name for s in self._specs)
        return names

    @property
    def specs(self):
        """The specs in order (tuple of BufferSpec)."""
        return self._specs

    def __len__(self):
        return len(self._specs)

    def __iter__(self):
        return iter(self._specs)

    def __contains__(self, name):
        return isinstance(name, str) and name in self._index

    def __getitem__(self, name):
        """The spec named `name` (KeyError if none)."""
        i = self._index.get(name) if isinstance(name, str) else None
        if i is None:
            raise KeyError(name)
        return self._specs[i]

    def index(self, name):
        """The position of buffer `name` in the set.

        Parameters
        ----------
        name : str
            A buffer of the set.

        Returns
        -------
        int

        Raises
        ------
        TypeError
            `name` is not a str.
        ValueError
            No buffer of that name (the message suggests near names).
        """
        if not isinstance(name, str):       # as every other name argument (_common.buffer_ids)
            raise TypeError(self._unknown(name))
        i = self._index.get(name)
        if i is None:
            raise ValueError(self._unknown(name))
        return i

    def _unknown(self, name, what="buffer"):
        import difflib
        if not isinstance(name, str):
            return f"{what} names are str, got {type(name).__name__}"
        near = difflib.get_close_matches(name, self.names, 3)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        return f"unknown {what} name {name!r} (not in this set of {len(self)}){hint}"

    @property
    def groups(self):
        """Helper or property -> the names it covers, in set order (dict).

        Keys: ``zero_all``, ``prefill``, ``rows`` (trimmed by
        ``zero_all_rows``), ``checksum``, ``total``, ``pointer`` and
        ``bytes`` (compiled accessors), ``init_zero`` and ``step``.
        """
        groups = self._cache.get("groups")
        if groups is None:
            groups = self._cache["groups"] = {
                g: tuple(s.name for s in self._specs if test(s)) for g, test in _GROUPS.items()}
        return dict(groups)

    # -- derived sets --------------------------------------------------------------------
    def without(self, names):
        """This set without some buffers.

        Parameters
        ----------
        names : str or iterable of str
            Buffers of this set.

        Returns
        -------
        BufferSet

        Raises
        ------
        TypeError
            `names` is not a str or an iterable of str.
        ValueError
            A name that is not in the set.
        """
        if isinstance(names, str):
            names = (names,)
        elif not hasattr(names, "__iter__"):
            raise TypeError(f"names must be a buffer name or an iterable of buffer names, got "
                            f"{type(names).__name__}")
        names = tuple(names)
        for n in names:
            self.index(n)
        drop = set(names)
        return BufferSet._trusted([s for s in self._specs if s.name not in drop])

    def with_(self, specs):
        """This set with more buffers, appended in order.

        Parameters
        ----------
        specs : BufferSpec or iterable of BufferSpec

        Returns
        -------
        BufferSet

        Raises
        ------
        TypeError, ValueError
            As the constructor: a name already in the set, too many buffers.
        """
        specs = (specs,) if isinstance(specs, BufferSpec) else tuple(specs)
        return BufferSet(self._specs + specs)

    def replace(self, name, /, **changes):
        """This set with one spec changed (`BufferSpec.replace`), in place in the order.

        Parameters
        ----------
        name : str
            A buffer of this set.
        **changes
            As `BufferSpec.replace`; ``name=`` renames it.

        Returns
        -------
        BufferSet

        Raises
        ------
        TypeError, ValueError
            An unknown buffer, or a change the spec or the set refuses.
        """
        i = self.index(name)
        specs = list(self._specs)
        specs[i] = specs[i].replace(**changes)
        return BufferSet(specs)

    # -- identity ------------------------------------------------------------------------
    def fingerprint(self):
        """A digest of everything that decides the layout (names, order,
        sizes, element types, helpers, alignment): equal sets have equal
        fingerprints.  Tensor-parallel ranks compare it.

        Returns
        -------
        str
            32 hex digits.
        """
        fp = self._cache.get("fingerprint")
        if fp is None:
            data = [[s.name, s.dtype, s.itemsize, s.formula, s.zero_all, s.prefill, s.rows,
                     s.checksum, s.align, s.init_zero] for s in self._specs]
            fp = self._cache["fingerprint"] = hashlib.sha256(
                json.dumps(data, separators=(",", ":")).encode()).hexdigest()[:32]
        return fp

    def __eq__(self, other):
        if type(other) is not BufferSet:
            return NotImplemented
        return self is other or self._specs == other._specs

    def __hash__(self):
        h = self._cache.get("hash")
        if h is None:
            h = self._cache["hash"] = hash(self._specs)
        return h

    def __reduce__(self):
        return (BufferSet._trusted, (self._specs,))

    def __repr__(self):
        if self is _reference():
            return "<BufferSet REFERENCE: 46 buffers>"
        return f"<BufferSet of {len(self)} buffers: {', '.join(self.names[:6])}" + \
            (", ...>" if len(self) > 6 else ">")

    # -- files (metrale/_buffer_files.py) ----------------------------------------------
    @classmethod
    def from_dict(cls, data, where="buffer set"):
        """A set from plain data, as a buffers file holds it.

        Parameters
        ----------
        data : dict
            ``base``: ``"reference"`` (default) or ``"empty"``; ``drop``: names of
            the base to leave out; ``replace``: name -> changed fields; ``buffer``:
            a list of new specs, each a dict of `BufferSpec` arguments.
        where : str, optional
            What the data is, for the messages (a file name).

        Returns
        -------
        BufferSet

        Raises
        ------
        TypeError, ValueError
            A key or value the format does not have, or a spec or set error
            (each message starts with `where`).
        """
        from ._buffer_files import from_dict
        return from_dict(data, where)

    @classmethod
    def load(cls, path):
        """A set from a buffers file: TOML (``.toml``) or JSON (``.json``).

        Parameters
        ----------
        path : str or os.PathLike
            The file; its format is told by its suffix (TOML otherwise).

        Returns
        -------
        BufferSet

        Raises
        ------
        OSError
            The file cannot be read.
        ValueError, TypeError
            It does not parse, or as `from_dict` (the file is named).
        """
        from ._buffer_files import load
        return load(path)

    def to_dict(self, base=None):
        """The set as plain data, the inverse of `from_dict`.

        Parameters
        ----------
        base : BufferSet, optional
            `REFERENCE` or an empty set (the bases a buffers file names):
            write the set as changes to it (dropped names, replaced specs,
            new ones); None: `REFERENCE` when this set keeps some of its
            buffers in its order with the new ones after, else every spec.

        Returns
        -------
        dict
            ``BufferSet.from_dict(s.to_dict(base)) == s`` always holds.

        Raises
        ------
        ValueError
            `base` is another set, or `REFERENCE` for a set that does not
            keep its reference buffers in their order ahead of its new ones
            (a file could not say where they go).
        """
        from ._buffer_files import to_dict
        return to_dict(self, base)


def _reference():
    from .reference import REFERENCE
    return REFERENCE


def buffer_set_arg(buffers):
    """The set a ``buffers=`` argument names: None means `REFERENCE`.

    Parameters
    ----------
    buffers : BufferSet or None
        The argument.

    Returns
    -------
    BufferSet

    Raises
    ------
    TypeError
        `buffers` is neither a BufferSet nor None.
    """
    if buffers is None:
        return _reference()
    if not isinstance(buffers, BufferSet):
        raise TypeError(f"buffers must be a BufferSet or None, got {type(buffers).__name__}")
    return buffers
