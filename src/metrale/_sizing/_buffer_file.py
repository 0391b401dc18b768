"""The bytes of a buffers file (docs/buffer-sets.md): read, bounded before
they are parsed, parsed as JSON or TOML into the plain data
`BufferSet.from_dict` takes.  Pure Python; knows nothing of the set itself
(metrale._sizing.buffers builds it).
"""

import itertools
import json
import re

__all__ = ["MAX_FILE_BYTES", "MAX_DEPTH", "MAX_TABLES", "read_data"]

from ._spec import MAX_BUFFERS


def read_data(path):
    """The plain data of the buffers file at `path`.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.json`` file, or TOML.

    Returns
    -------
    object
        What the file holds (a dict, for a buffers file).

    Raises
    ------
    OSError
        The file cannot be read.
    ValueError
        It is past a bound (`MAX_FILE_BYTES`, `MAX_DEPTH`, `MAX_TABLES`) or
        does not parse (the file is named).
    """
    import os
    path = os.fspath(path)
    with open(path, "rb") as f:
        raw = f.read(MAX_FILE_BYTES + 1)
    _bounded(raw, path, path.endswith(".json"))
    if path.endswith(".json"):
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ValueError(f"{path}: not JSON: {e}") from None
    return _toml(raw, path)


# What a buffers file may hold, checked on its bytes before it is parsed: a
# parser recurses once per level of nesting (100,000 '[' were a RecursionError)
# and TOML's takes seconds for 250,000 tables (it was 6.7 s before the count was
# refused).  The reference set written whole is 29 KB, 47 tables, 4 levels deep:
# 256 buffers with long texts stay far below these.
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_TABLES = 4 * MAX_BUFFERS        # every buffer once new and once replaced, with room

# What is not structure: strings (and TOML's comments), longest forms first.
_JSON_SKIP = re.compile(rb'"(?:[^"\\]|\\.)*"')
_TOML_SKIP = re.compile(rb'"""(?:[^\\]|\\.)*?"""|\'\'\'[\s\S]*?\'\'\'|"(?:[^"\\\n]|\\.)*"'
                        rb"|'[^'\n]*'|#[^\n]*")
_BRACKETS = re.compile(rb"[\[\]{}]")
_HEADER = re.compile(rb"^[ \t]*\[", re.M)


def _bounded(raw, path, is_json):
    """Refuse, before parsing, a buffers file longer than MAX_FILE_BYTES,
    nested deeper than MAX_DEPTH, or holding more than MAX_TABLES tables or
    16 arrays and tables a table (an overcount where brackets begin lines of
    a multi-line TOML array: harmless).  Milliseconds whatever the file."""
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB, the most a buffers "
                         "file holds")
    bare = (_JSON_SKIP if is_json else _TOML_SKIP).sub(b"", raw)
    most_open = 16 * MAX_TABLES         # a spec opens a few (its shape, its accessors)
    depth = 0
    for m in itertools.islice(_BRACKETS.finditer(bare), 2 * most_open + 1):
        depth += 1 if m.group() in b"[{" else -1
        if depth > MAX_DEPTH:
            raise ValueError(f"{path}: nested more than {MAX_DEPTH} levels deep (a buffers "
                             "file needs 4)")
    tables = bare.count(b"{") + (0 if is_json else len(_HEADER.findall(bare)))
    if tables > MAX_TABLES:
        raise ValueError(f"{path}: more than {MAX_TABLES} tables ({tables}); a buffer set holds "
                         f"at most {MAX_BUFFERS} buffers")
    opened = bare.count(b"[") + bare.count(b"{")
    if opened > most_open:
        raise ValueError(f"{path}: more than {most_open} arrays and tables ({opened})")


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
