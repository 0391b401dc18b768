"""Buffer sets as files: the plain-data form of a set (TOML or JSON) that
``metrale plan --buffers`` reads, and its inverse.  `BufferSet.from_dict`,
`BufferSet.load` and `BufferSet.to_dict` are these functions (their docstrings
say what each does).  The format: ``base`` (``"reference"`` or ``"empty"``),
``drop`` (names of the base to leave out), ``replace`` (name -> changed
fields) and ``buffer`` (new specs, each a table of `BufferSpec` arguments).
"""

import json

from .buffers import BufferSet, BufferSpec, _reference


def from_dict(data, where):
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
    if base not in ("reference", "empty"):
        raise ValueError(f"{where}: base must be 'reference' or 'empty', got {base!r}")
    out = _reference() if base == "reference" else BufferSet()
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


def load(path):
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
    with open(path, "rb") as f:
        raw = f.read()
    if path.endswith(".json"):
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ValueError(f"{path}: not JSON: {e}") from None
    else:
        data = _toml(raw, path)
    return from_dict(data, path)


def to_dict(self, base):
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
    ref = _reference()
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


def _toml(raw, path):
    try:
        import tomllib
    except ImportError:         # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise ValueError(f"{path}: reading TOML on Python 3.10 needs the tomli package "
                             "(pip install tomli), or give the set as JSON") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: not TOML: {e}") from None
