"""safetensors files read by their format, for metrale.weights: an 8-byte
little-endian header length, a JSON header (each tensor's element type, shape
and byte bounds), the tensors' bytes back to back; and the index of a sharded
checkpoint (``*.safetensors.index.json``: tensor names to file names).  Only
the headers are read here; `load` reads the bytes.
Plain Python and the standard library.
"""

import json
import os
import struct

from .._base._dtypes import ITEMSIZE
from .._base._record import Record

__all__ = ["SAFETENSORS_DTYPES", "MAX_HEADER", "INDEX_SUFFIX", "SafetensorsEntry",
           "read_safetensors", "numel", "source_paths", "entries_of"]

# safetensors' element types (its format's names) -> metrale's.
SAFETENSORS_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16",
    "BF16": "bfloat16", "F32": "float32", "F64": "float64", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}
# A header larger than this is refused, as the format's reference reader does.
MAX_HEADER = 100_000_000
# The index file a sharded checkpoint names its files in (Hugging Face's name).
INDEX_SUFFIX = ".index.json"


class SafetensorsEntry(Record):
    """A tensor of a safetensors file, as its header describes it.

    Attributes
    ----------
    name : str
        Its name in the file.
    dtype : str
        Its element type, metrale's name for it (`SAFETENSORS_DTYPES`).
    shape : tuple of int
        Its shape.
    begin, end : int
        Its bytes' bounds in the file, counted from the file's start.
    """

    __slots__ = ("name", "dtype", "shape", "begin", "end")


def numel(shape):
    """The elements of a shape.

    Parameters
    ----------
    shape : sequence of int
        Its dimensions (empty: a scalar, one element).
    """
    n = 1
    for d in shape:
        n *= d
    return n


def _path_arg(path, where):
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{where}: a path must be a str or os.PathLike, got {type(path).__name__}")
    return os.fspath(path)


def read_safetensors(path):
    """The tensors of a safetensors file, from its header alone.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.safetensors`` file.

    Returns
    -------
    tuple of SafetensorsEntry
        Every tensor (the ``__metadata__`` entry left out), in the order of
        its bytes in the file.

    Raises
    ------
    ValueError
        The file is not a well-formed safetensors file (naming what is wrong:
        the header's length or JSON, a tensor's element type, shape or byte
        bounds, bytes that overlap or leave a gap, or lie past the file's end).
    OSError
        The file cannot be read.
    """
    path = _path_arg(path, "read_safetensors")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header "
                             "length)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise ValueError(f"{path}: header length {n:,} is past the file's {size:,} bytes "
                             f"or the limit of {MAX_HEADER:,}")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is not a JSON object")
    base, out = 8 + n, []
    for name, e in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {name!r}"
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise ValueError(f"{where}: an entry holds exactly dtype, shape and data_offsets")
        dtype = SAFETENSORS_DTYPES.get(e["dtype"]) if isinstance(e["dtype"], str) else None
        if dtype is None:
            raise ValueError(f"{where}: element type {e['dtype']!r} is not one of "
                             + ", ".join(SAFETENSORS_DTYPES))
        shape = e["shape"]
        if not isinstance(shape, list) or any(type(d) is not int or d < 0 for d in shape):
            raise ValueError(f"{where}: shape must be a list of ints >= 0, got {shape!r}")
        bounds = e["data_offsets"]
        if not (isinstance(bounds, list) and len(bounds) == 2
                and all(type(b) is int and b >= 0 for b in bounds)):
            raise ValueError(f"{where}: data_offsets must be [begin, end], got {bounds!r}")
        lo, hi = bounds
        want = numel(shape) * ITEMSIZE[dtype]
        if hi - lo != want:
            raise ValueError(f"{where}: data_offsets hold {hi - lo:,} bytes, its shape "
                             f"{shape} of {dtype} needs {want:,}")
        if base + hi > size:
            raise ValueError(f"{where}: its bytes end at {base + hi:,}, past the file's "
                             f"{size:,}")
        out.append(SafetensorsEntry(name, dtype, tuple(shape), base + lo, base + hi))
    out.sort(key=lambda t: (t.begin, t.end))
    at = base
    for t in out:                   # the format: bytes back to back, no hole, no overlap
        if t.begin != at:
            raise ValueError(f"{path}: tensor {t.name!r} starts at {t.begin - base:,}, "
                             f"where the bytes before it end at {at - base:,}")
        at = t.end
    if at != size:
        raise ValueError(f"{path}: {size - at:,} bytes after the last tensor's (the format "
                         "indexes every byte)")
    return tuple(out)


def _files(source, where):
    """The safetensors files a path names, and the index's weight_map: the
    file itself and None, or an index's files (by name) and its map."""
    path = _path_arg(source, where)
    if not path.endswith(INDEX_SUFFIX):
        return [path], None
    with open(path, "rb") as f:
        try:
            index = json.loads(f.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not JSON: {e}") from None
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise ValueError(f"{path}: an index holds a weight_map of tensor names to file names")
    for v in wm.values():
        if os.path.basename(v) != v:
            raise ValueError(f"{path}: weight_map names a file outside its folder: {v!r}")
    folder = os.path.dirname(path)
    return [os.path.join(folder, v) for v in sorted(set(wm.values()))], wm


def _check_index(where, wm, found):
    """An index's map against the files' tensors ({name: path}): the same names,
    each in the file the index says."""
    for name, file in wm.items():
        if name not in found:
            raise ValueError(f"{where}: the index names tensor {name!r} in {file}, which "
                             "lacks it")
        if os.path.basename(found[name]) != file:
            raise ValueError(f"{where}: the index names tensor {name!r} in {file}, it is "
                             f"in {os.path.basename(found[name])}")
    for name in found:
        if name not in wm:
            raise ValueError(f"{where}: tensor {name!r} of {found[name]} is not in the "
                             "index")


def _is_source_path(source):
    return isinstance(source, (str, os.PathLike))


def source_paths(source, where):
    """A path, or a list or tuple of paths, as a list of paths; None otherwise.

    Parameters
    ----------
    source : object
        What a caller was given: safetensors paths, or something else.
    where : str
        The caller's name, for messages.
    """
    if _is_source_path(source):
        return [source]
    if isinstance(source, (list, tuple)) and source and all(map(_is_source_path, source)):
        return list(source)
    return None


def entries_of(paths, where):
    """Every tensor of the files the paths name, as (file, SafetensorsEntry).

    Parameters
    ----------
    paths : sequence of str or os.PathLike
        safetensors files and indexes (an index stands for its files, in the
        order of their names; each file's tensors in the order of their bytes).
    where : str
        The caller's name, for messages.

    Raises
    ------
    ValueError
        A file or index is not well formed, an index and its files disagree,
        or a tensor is in two files.
    """
    out, seen = [], {}
    for p in paths:
        files, wm = _files(p, where)
        found = {}
        for path in files:
            for e in read_safetensors(path):
                if e.name in seen:
                    raise ValueError(f"{where}: tensor {e.name!r} is in both {seen[e.name]} "
                                     f"and {path}")
                seen[e.name] = found[e.name] = path
                out.append((path, e))
        if wm is not None:
            _check_index(where, wm, found)
    return out
