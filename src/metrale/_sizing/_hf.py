"""Reading a Hugging Face ``config.json`` into ModelConfig fields.

`ModelConfig.from_hf_config` (metrale/_sizing/config.py) builds the value from what
`read_hf` returns and has `report_hf` warn about, or refuse, what it did not
understand.  What it reads is the tables of metrale._sizing._hf_tables, from
which docs/hf-config.md is generated.
"""

import os

from .._base._fields import _BOOL_FIELDS
from ._hf_tables import (_FAMILY_OF, _HF_REQUIRED, _IGNORED, _KEYS, _RULES, _SHAPE_WORDS, _Ctx)


def read_hf(path_or_dict):
    """The ModelConfig fields a config.json gives.

    Parameters
    ----------
    path_or_dict : str, os.PathLike or dict
        As `ModelConfig.from_hf_config` takes it: the path of a
        ``config.json``, a directory holding one, or the parsed dict.

    Returns
    -------
    fields : dict of str to object
        Field name -> value, for the fields the config gives.
    notes : list of (str, str)
        What was not understood: (config key, message) pairs.
    where : str
        Where the config came from, as the messages name it: the file's
        path (``DIR/config.json`` for a directory), or ``"config dict"``
        for a dict.

    Raises
    ------
    TypeError, ValueError, OSError
        As `ModelConfig.from_hf_config` documents them (but `strict`).
    """
    if isinstance(path_or_dict, dict):
        # No file to name: the messages say what was given.
        data, where = path_or_dict, "config dict"
    else:
        if not isinstance(path_or_dict, (str, os.PathLike)):
            raise TypeError("path_or_dict must be a path or a dict, "
                            f"got {type(path_or_dict).__name__}")
        path = os.fspath(path_or_dict)
        if not isinstance(path, str):
            raise TypeError(f"path_or_dict must be a str path, got {type(path).__name__}")
        if path.lstrip().startswith(("{", "[")):
            raise ValueError("path_or_dict is a str holding JSON text, not a path; "
                             "pass json.loads(text) or the file's path")
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        data, where = _read_json(path), path
    fields, notes = _map_hf(data, where)
    return fields, notes, where


def report_hf(notes, where, strict):
    """Refuse or warn about what a config.json gave that was not understood.

    Parameters
    ----------
    notes : list of (str, str)
        The notes `read_hf` returned (not empty).
    where : str
        Where the config came from.
    strict : bool
        Raise instead of warning.

    Warns
    -----
    ConfigWarning
        One per note, without `strict`, on the line that called
        `ModelConfig.from_hf_config`.

    Raises
    ------
    ValueError
        With `strict`: the message names every key.
    """
    if strict:
        keys = ", ".join(repr(k) for k, _ in notes)
        raise ValueError(f"{where}: not understood (strict=True): {keys}; "
                         + "; ".join(m.split(": ", 1)[1] for _, m in notes))
    import warnings
    from .._base.errors import ConfigWarning
    for key, message in notes:
        warnings.warn(ConfigWarning(message, key), stacklevel=3)


def _read_json(path):
    import json
    with open(path, "rb") as f:
        raw = f.read()
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except ValueError as e:    # JSONDecodeError, or an int past the digit limit
        raise ValueError(f"{path}: malformed JSON: {e}") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply to read") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a config.json must hold a JSON object, got {type(data).__name__}")
    return data


def _looks_like_a_dimension(key, value):
    if type(value) is bool:
        return False
    if not isinstance(value, int) and not (
            isinstance(value, list) and value and all(type(x) is int for x in value)):
        return False
    words = key.lower().split("_")
    return words[0] in ("num", "n") or not _SHAPE_WORDS.isdisjoint(words)


def _consumed():
    """Every config key some field or rule reads."""
    keys = {"model_type", "text_config"}
    for k in _KEYS:
        keys.update(k.keys)
    for r in _RULES:
        keys.update(r.reads)
    return frozenset(keys)


_CONSUMED = _consumed()


def _ignored(key):
    from fnmatch import fnmatchcase
    for row in _IGNORED:
        for pattern in row.keys:
            if pattern == key or ("*" in pattern and fnmatchcase(key, pattern)):
                return True
    return False


def _map_hf(data, where):
    """The fields of a parsed config.json, and the notes on what was not
    understood: (key, message) pairs."""
    text = data.get("text_config")
    text = text if isinstance(text, dict) else {}

    def lookup(key):
        for src in (text, data):
            v = src.get(key)
            if v is not None:     # JSON null counts as absent
                return True, v
        return False, None

    out = {}
    mt = data.get("model_type")
    out["model_type"] = mt if isinstance(mt, str) else ""
    tmt = text.get("model_type")
    family = tmt if isinstance(tmt, str) and tmt else out["model_type"]
    for row in _KEYS:
        for key in row.keys:
            found, v = lookup(key)
            if found:
                if row.field in _BOOL_FIELDS:
                    if not isinstance(v, bool):
                        raise TypeError(f"{where}: config key {key!r} must be a JSON boolean")
                elif type(v) is bool or not isinstance(v, int):
                    raise TypeError(f"{where}: config key {key!r} must be a JSON integer, "
                                    f"got {type(v).__name__}")
                out[row.field] = v
                break
    fam = _FAMILY_OF.get(family)
    defaulted = []
    if fam is not None:
        for name, v in fam.defaults.items():
            if name not in out:
                out[name] = v
                if name not in fam.quiet:
                    defaulted.append((name, v))
    ctx = _Ctx(lookup, out["model_type"], where)
    for rule in _RULES:
        rule.apply(out, ctx)
    for name in _HF_REQUIRED:
        if name not in out:
            keys = next(k.keys for k in _KEYS if k.field == name)
            keys = tuple(k for k in keys if k != name)
            also = f" (or {', '.join(keys)})" if keys else ""
            raise ValueError(f"{where}: the config has no {name!r}{also}: it does not give "
                             "the model's shape")
    notes = [(name, f"{where}: config key {name!r} is absent: took the default of "
              f"transformers' {fam.source}, {v:,}; give the key if the model's "
              f"{name} is not {v:,} (docs/hf-config.md)") for name, v in defaulted]
    if fam is None:
        what = f"model_type {family!r} is not a family metrale knows" if family else \
            "the config has no model_type"
        notes.append(("model_type", f"{where}: {what}; it was read with the standard keys "
                      "(docs/hf-config.md), so check the sizes"))
    for src in (data, text) if text else (data,):
        for key, value in src.items():
            if key in _CONSUMED or _ignored(key) or not _looks_like_a_dimension(key, value):
                continue
            notes.append((key, f"{where}: config key {key!r} = {value!r} looks like a model "
                          "dimension, but metrale does not read it: the buffer sizes may be "
                          "too small for this model (docs/hf-config.md)"))
    return out, notes
