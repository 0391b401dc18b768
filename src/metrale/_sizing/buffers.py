"""Buffer sets: the buffers an engine's arena holds, declared as data.

A `BufferSpec` declares one buffer: its name, element type, size (a shape in
terms of the limits and the model config, or a formula in the language of
`metrale.formulas`), which helpers cover it (``zero_all``,
``zero_prefill_essentials``, the row rule of ``zero_all_rows``, the
checksum), its alignment and what the catalogue says about it.  A `BufferSet`
is an ordered, immutable collection of specs; `REFERENCE` is the reference
engine's 46 (metrale/_sizing/_reference_table.py, the one place they are written), and an
engine derives its own from it (`BufferSet.without`, `BufferSet.with_`,
`BufferSet.replace`) or builds one from scratch.  (``metrale.REFERENCE``
is ``metrale.reference.REFERENCE``, made there from the table in
metrale/_sizing/_reference_table.py; this layer knows it only as the base a buffers
file names, `register_base`.)  docs/buffer-sets.md has a worked example.

Every spec is checked when it is made and every set when it is built, so a
bad declaration raises ``ValueError`` naming the spec and the field before
anything is sized or allocated.  Pure Python: it loads the spec module
(`metrale._sizing._spec`), nothing that sizes or allocates.
"""

import hashlib
import json

__all__ = ["BufferSpec", "BufferSet", "ROW_RULES", "ACCESSORS", "MAX_BUFFERS",
           "MAX_ZERO_ALL", "RESERVED_NAMES", "STEP_ROLES"]

from ._suggest import near_names
from ._wake import MAX_CLASSES
from ._buffer_file import MAX_DEPTH, MAX_FILE_BYTES, MAX_TABLES, read_data  # noqa: F401 (published)
from ._spec import (ACCESSORS, MAX_BUFFERS, MAX_ZERO_ALL, RESERVED_NAMES, ROW_RULES, STEP_ROLES,
                    BufferSpec, check_step_roles)

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
    "step": lambda s: s.step != "",
    # by wake contract (_wake.py): those a sleep keeps, offloads, fills on
    # wake, leaves undefined (the others wake zeroed)
    "wake_keep": lambda s: s.wake == "keep",
    "wake_offload": lambda s: s.wake == "offload",
    "wake_fill": lambda s: s.wake.startswith("fill:"),
    "wake_undefined": lambda s: s.wake == "undefined",
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
        two buffers holding one step role (`BufferSpec`'s ``step``; a
        ``count`` beside a ``decode_meta``, which holds the count too).
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
        check_step_roles(specs)
        if len({s.tag for s in specs}) > MAX_CLASSES:
            raise ValueError(f"a buffer set has at most {MAX_CLASSES} classes (tags), got "
                             f"{len({s.tag for s in specs})}")
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
        if not isinstance(name, str):
            return f"{what} names are str, got {type(name).__name__}"
        near = near_names(name, self.names)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        return f"unknown {what} name {name!r} (not in this set of {len(self)}){hint}"

    @property
    def groups(self):
        """Helper or property -> the names it covers, in set order (dict).

        Keys: ``zero_all``, ``prefill``, ``rows`` (trimmed by
        ``zero_all_rows``), ``checksum``, ``total``, ``pointer`` and
        ``bytes`` (compiled accessors), ``init_zero``, ``step``, and by wake
        contract ``wake_keep``, ``wake_offload``, ``wake_fill`` and
        ``wake_undefined`` (every other buffer wakes zeroed).
        """
        groups = self._cache.get("groups")
        if groups is None:
            groups = self._cache["groups"] = {
                g: tuple(s.name for s in self._specs if test(s)) for g, test in _GROUPS.items()}
        return dict(groups)

    @property
    def classes(self):
        """Class (tag) -> the names of its buffers, in set order (dict); the
        classes in the order of their first buffer."""
        classes = self._cache.get("classes")
        if classes is None:
            classes = self._cache["classes"] = {t: tuple(s.name for s in self._specs if s.tag == t)
                                                for t in dict.fromkeys(s.tag for s in self._specs)}
        return dict(classes)

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
            # the step role places a buffer: in the digest where it has one
            data = [[s.name, s.dtype, s.itemsize, s.formula, s.zero_all, s.prefill, s.rows,
                     s.checksum, s.align, s.init_zero] + ([s.step] if s.step else [])
                    for s in self._specs]
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
        for name, base in _BASES.items():
            if self is base:
                return f"<BufferSet {name.upper()}: {len(self)} buffers>"
        return f"<BufferSet of {len(self)} buffers: {', '.join(self.names[:6])}" + \
            (", ...>" if len(self) > 6 else ">")

    # -- files (below: _from_dict, _load, _to_dict) ----------------------------------------------
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
        return _from_dict(data, where)

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
        return _load(path)

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
        return _to_dict(self, base)



# The sets a buffers file names as its base, by name.  The set layer knows no
# engine's buffers: metrale.reference registers "reference" (REFERENCE) when the
# package is imported; a set's repr names the base it is.
_BASES = {}


def register_base(name, buffers):
    """Make `buffers` the base a buffers file names as ``base = "NAME"``.

    Parameters
    ----------
    name : str
        The name files use (``"reference"``); ``"empty"`` is always the empty set.
    buffers : BufferSet
        The set.
    """
    if not isinstance(buffers, BufferSet):
        raise TypeError(f"buffers must be a BufferSet, got {type(buffers).__name__}")
    if not isinstance(name, str) or name == "empty" or name in _BASES:
        raise ValueError(f"base {name!r} is taken or not a name")
    _BASES[name] = buffers


# -- files: the plain-data form of a set (TOML or JSON) that ``metrale plan
# --buffers`` reads, and its inverse.  The format: ``base`` (``"reference"`` or
# ``"empty"``), ``drop`` (names of the base to leave out), ``replace`` (name ->
# changed fields) and ``buffer`` (new specs, each a table of BufferSpec arguments).
def _from_dict(data, where):
    """`BufferSet.from_dict`.

    Parameters
    ----------
    data : dict
        The plain data (module docstring).
    where : str
        What it is, for the messages.

    Returns
    -------
    BufferSet
    """
    if not isinstance(data, dict):
        raise TypeError(f"{where}: a table (dict) at the top, got {type(data).__name__}")
    unknown = set(data) - {"base", "drop", "replace", "buffer"}
    if unknown:
        raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r}; the keys are base, "
                         "drop, replace, buffer")
    base = data.get("base", "reference")
    if base != "empty" and (not isinstance(base, str) or base not in _BASES):
        names = " or ".join(repr(b) for b in (*_BASES, "empty"))
        raise ValueError(f"{where}: base must be {names}, got {base!r}")
    out = _BASES[base] if base != "empty" else BufferSet()
    try:
        drop = data.get("drop", [])
        if not isinstance(drop, list) or not all(isinstance(n, str) for n in drop):
            raise TypeError("drop must be a list of buffer names")
        out = out.without(drop)
        changes = data.get("replace", {})
        if not isinstance(changes, dict):
            raise TypeError("replace must be a table of buffer name -> fields")
        for name, fields in changes.items():
            if not isinstance(fields, dict):
                raise TypeError(f"replace.{name} must be a table of fields")
            out = out.replace(name, **fields)
        new = data.get("buffer", [])
        if not isinstance(new, list):
            raise TypeError("buffer must be a list of tables ([[buffer]])")
        if len(out) + len(new) > MAX_BUFFERS:       # before a spec is built
            raise ValueError(f"a buffer set holds at most {MAX_BUFFERS} buffers, got "
                             f"{len(out) + len(new)}")
        specs = []
        for i, fields in enumerate(new):
            if not isinstance(fields, dict) or not isinstance(fields.get("name"), str):
                raise TypeError(f"buffer[{i}] must be a table with a name")
            fields = dict(fields)
            name = fields.pop("name")
            try:
                specs.append(BufferSpec(name, **fields))
            except TypeError as e:
                if "unexpected keyword" in str(e):
                    raise TypeError(f"buffer spec {name!r}: {e}") from None
                raise
        return out.with_(specs)
    except (TypeError, ValueError) as e:
        raise (TypeError if isinstance(e, TypeError) else ValueError)(f"{where}: {e}") from None


def _load(path):
    """`BufferSet.load`.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.json`` file, or TOML.

    Returns
    -------
    BufferSet
    """
    import os
    path = os.fspath(path)
    return _from_dict(read_data(path), path)


def _to_dict(self, base):
    """`BufferSet.to_dict` of the set `self`.

    Parameters
    ----------
    self : BufferSet
        The set.
    base : BufferSet or None
        As `BufferSet.to_dict`.

    Returns
    -------
    dict
    """
    ref = _BASES["reference"]
    # REFERENCE as the base only when the set is its buffers in its order
    # (some dropped or replaced), then new ones: the form from_dict rebuilds
    kept = [s.name for s in self._specs if s.name in ref]
    ordered = bool(kept) and kept == [n for n in ref.names if n in self] and \
        list(self.names[:len(kept)]) == kept
    if base is None:
        base = ref if ordered else BufferSet()
    elif not isinstance(base, BufferSet) or (base != ref and len(base)):
        raise ValueError("to_dict: base must be REFERENCE or an empty BufferSet (the bases a "
                         "buffers file names), or None")
    elif base == ref and not ordered:
        raise ValueError("to_dict: this set cannot be written as changes to REFERENCE: its "
                         "reference buffers are not in REFERENCE's order ahead of its new ones "
                         "(give base=None or an empty set)")
    out = {"base": "reference" if base == ref else "empty"}
    if base == ref:
        drop = [n for n in base.names if n not in self]
        if drop:
            out["drop"] = drop
        rep = {}
        for s in self._specs:
            if s.name in base and s != base[s.name]:
                mine, theirs = s._arguments(), base[s.name]._arguments()
                # every field that differs, defaults included (to_dict leaves those out)
                rep[s.name] = {k: list(v) if isinstance(v, tuple) else v
                               for k, v in mine.items() if k != "name" and theirs[k] != v}
        if rep:
            out["replace"] = rep
    new = [s.to_dict() for s in self._specs if s.name not in base]
    if new:
        out["buffer"] = new
    return out
