"""A model's weights in an arena of their own: declared from the checkpoint, loaded and checked.

`weight_set` turns a model's parameters (a mapping of names to ``(dtype,
shape)`` pairs or to numpy arrays / torch tensors, or safetensors files, or a
safetensors index) into a `WeightSet`: every parameter with its checkpoint
name, exact shape and element type, at an offset aligned for GEMMs, in the
mapping's order (a file's tensors in the order of their bytes), all in one
buffer of class ``"weights"`` with wake contract ``"offload"``.  One buffer, not
one per parameter: a buffer set holds at most 256 buffers (the C core's
tables), where a 1.7B Qwen3 has 311 tensors and a DeepSeek-V3 tens of
thousands; the class is what sleeps, wakes and is guarded
(docs/stable-addresses.md), and the parameters are the set's own table.
Offload, not keep: a sleep moves the bytes to pinned host memory mapped at
their own addresses (made by the first sleep, reused by every later one), so
a module whose parameters are the arena's tensors (`metrale.torch.bind`)
stays valid while the weights sleep; a kept buffer's views would refuse the
sleep.

`weight_arena` makes a reserved arena for it; `load` copies a state dict or
safetensors files in, after checking every name, shape and element type
(a missing or an extra tensor is refused, naming it, before a byte moves),
one copy per run of parameters that lie back to back both in the source
and in the arena.  See docs/weights.md.

Plain Python and the standard library: safetensors files are read by their
format (metrale._integrations._safetensors), their bytes read straight into
host memory (or through one reused buffer to the device), not mapped: a file
cut short under a map would fault the process.
"""

import sys
from collections.abc import Mapping

from ._hf_params import SUPPORTED_MODEL_TYPES, hf_params
from ._weight_copies import Sink, runs_of
from ._safetensors import (INDEX_SUFFIX, MAX_HEADER, SAFETENSORS_DTYPES, SafetensorsEntry,
                           entries_of, numel, read_safetensors, source_paths)
from .._arena._buffer_arena import BufferArena
from .._base._common import resolve_dtype
from .._base._dtypes import ITEMSIZE
from .._base._record import Record
from .._base.errors import MetraleError
from .._sizing.buffers import BufferSet, BufferSpec
from .._sizing.config import ModelConfig
from .._sizing.sizes import BufferSizes

__all__ = ["Param", "WeightSet", "LoadStats", "SafetensorsEntry", "SAFETENSORS_DTYPES",
           "MAX_HEADER", "INDEX_SUFFIX", "DEFAULT_ALIGN", "weight_set", "read_safetensors",
           "weight_arena", "load", "hf_params", "SUPPORTED_MODEL_TYPES"]

DEFAULT_ALIGN = 256
_MAX_ALIGN = 1 << 30


class Param(Record):
    """One parameter of a `WeightSet`.

    Attributes
    ----------
    name : str
        Its checkpoint name (``model.layers.0.mlp.gate_proj.weight``).
    dtype : str
        Its element type (one of `metrale.DTYPE_NAMES`).
    shape : tuple of int
        Its exact shape.
    offset : int
        Its first byte in the weights buffer: a multiple of the set's `align`.
    nbytes : int
        Its bytes (elements times element size; the padding to the next
        parameter not counted).
    """

    __slots__ = ("name", "dtype", "shape", "offset", "nbytes")


class LoadStats(Record):
    """What `load` did.

    Attributes
    ----------
    params : int
        The parameters written: every one of the set.
    nbytes : int
        Their bytes.
    copies : int
        The copies made: one per run of parameters that lie back to back in
        the source and in the arena.
    """

    __slots__ = ("params", "nbytes", "copies")


def _align_arg(align):
    if type(align) is not int:
        raise TypeError(f"weight_set: align must be an int, got {type(align).__name__}")
    if align < DEFAULT_ALIGN or align > _MAX_ALIGN or align & (align - 1):
        raise ValueError(f"weight_set: align must be a power of two from {DEFAULT_ALIGN} to "
                         f"2**30, got {align}")
    return align


def _shape_arg(shape, where):
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"{where}: shape must be a tuple or list of ints, got "
                        f"{type(shape).__name__}")
    out = []
    for i, d in enumerate(shape):
        if type(d) is not int:       # not bool, not an object with __index__
            raise TypeError(f"{where}: shape[{i}] must be an int, got {type(d).__name__}")
        if d < 0:
            raise ValueError(f"{where}: shape[{i}] must be >= 0, got {d}")
        out.append(d)
    return tuple(out)


def _dtype_arg(dtype, where):
    try:
        return resolve_dtype(dtype)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{where}: {e}") from None


def _array_kind(value):
    """"numpy" or "torch" for an array or tensor of a module already imported
    (neither is imported here), else None: no other object's attributes are
    looked up."""
    np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    if np is not None and isinstance(value, np.ndarray):
        return "numpy"
    if torch is not None and isinstance(value, torch.Tensor):
        return "torch"
    return None


def _is_module(value):
    """A torch module, torch already imported (it is not imported here)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.nn.Module)


def _described(value, where):
    """(dtype, shape) of a parameter's description: a pair, or a numpy array
    or torch tensor."""
    if isinstance(value, tuple) and len(value) == 2:
        dtype, shape = value
        return _dtype_arg(dtype, where), _shape_arg(shape, where)
    if _array_kind(value) is not None:
        return _dtype_arg(value.dtype, where), _shape_arg(tuple(int(d) for d in value.shape),
                                                          where)
    raise TypeError(f"{where}: a parameter is a (dtype, shape) pair, a numpy array or a torch "
                    f"tensor, got {type(value).__name__}")


class WeightSet:
    """A model's parameters laid out in one buffer (made by `weight_set`).

    Iterating gives the `Param` records in order; ``ws[name]`` one of them.

    Parameters
    ----------
    described : iterable of (str, dtype, tuple of int)
        Each parameter's name, element type and shape (checked: a name is a
        non-empty str given once, a dtype as `metrale.resolve_dtype` takes
        it, a shape a tuple or list of ints >= 0).
    align, buffer, tag, wake
        As `weight_set`'s.

    Attributes
    ----------
    params : tuple of Param
        Every parameter, in the set's order, at increasing offsets.
    buffer : str
        The buffer that holds them (``"weights"`` unless named otherwise).
    tag : str
        The buffer's class.
    wake : str
        The buffer's wake contract.
    align : int
        Every parameter's offset is a multiple of it.
    nbytes : int
        The buffer's size: the last parameter's end, rounded up to `align`.
    buffers : metrale.BufferSet
        The set of that one buffer, for an arena.
    """

    __slots__ = ("params", "buffer", "tag", "wake", "align", "nbytes", "buffers", "_index")

    def __init__(self, described, *, align=DEFAULT_ALIGN, buffer="weights", tag="weights",
                 wake="offload"):
        align = _align_arg(align)
        params, index, off = [], {}, 0
        for item in described:
            if not (isinstance(item, tuple) and len(item) == 3):
                raise TypeError("WeightSet: each parameter is a (name, dtype, shape) tuple")
            name, dtype, shape = item
            where = f"WeightSet: parameter {name!r}"
            if not isinstance(name, str):
                raise TypeError(f"WeightSet: a parameter's name must be a str, got "
                                f"{type(name).__name__}")
            if not name:
                raise ValueError("WeightSet: a parameter's name is empty")
            if name in index:
                raise ValueError(f"{where} is named twice")
            dtype, shape = _dtype_arg(dtype, where), _shape_arg(shape, where)
            n = numel(shape) * ITEMSIZE[dtype]
            index[name] = len(params)
            params.append(Param(name, dtype, shape, off, n))
            off += -(-n // align) * align
        self.params = tuple(params)
        self._index = index
        self.nbytes = max(off, align)           # a buffer is never empty
        # the name, class and contract: checked by BufferSpec
        self.buffers = BufferSet([BufferSpec(buffer, None, size=self.nbytes, align=align,
                                             wake=wake, tag=tag)])
        self.buffer, self.tag, self.wake, self.align = buffer, tag, wake, align

    def __len__(self):
        return len(self.params)

    def __iter__(self):
        return iter(self.params)

    def __contains__(self, name):
        return name in self._index

    def __getitem__(self, name):
        i = self._index.get(name) if isinstance(name, str) else None
        if i is None:
            raise KeyError(f"weight set has no parameter {name!r}")
        return self.params[i]

    @property
    def names(self):
        """The parameters' names, in order."""
        return tuple(p.name for p in self.params)

    def __eq__(self, other):
        if type(other) is not WeightSet:
            return NotImplemented
        return (self.params, self.buffer, self.tag, self.wake, self.align) == \
            (other.params, other.buffer, other.tag, other.wake, other.align)

    def __hash__(self):
        return hash((self.params, self.buffer, self.tag, self.wake, self.align))

    def __repr__(self):
        return (f"WeightSet({len(self.params)} params, {self.nbytes:,} bytes in "
                f"{self.buffer!r}, class {self.tag!r})")


# -- the set -----------------------------------------------------------------------------


def weight_set(params, *, align=DEFAULT_ALIGN, buffer="weights", tag="weights",
               wake="offload"):
    """A model's parameters as a `WeightSet`.

    Parameters
    ----------
    params : mapping, torch module, path or list of paths
        A mapping of parameter names to ``(dtype, shape)`` pairs, numpy
        arrays or torch tensors (a state dict: only their element types and
        shapes are read), in the order the set keeps (`hf_params` gives one
        for a Hugging Face config); a ``torch.nn.Module``, its
        ``named_parameters()`` (a tied parameter once, under its first name;
        a module built on the meta device has no weights to read); or safetensors files
        (a path, a list of paths, or a ``*.safetensors.index.json`` of a
        sharded checkpoint): their tensors, file by file, each file's in the
        order of their bytes, so that a load copies runs of them at once.
    align : int
        Every parameter's offset is a multiple of it: a power of two from 256
        (the default: what cuBLAS and CUTLASS want of a GEMM operand) to 2**30.
    buffer : str
        The name of the buffer that holds them.
    tag : str
        Its class (``"weights"``: what `arena.sleep(tags=)`, `wake` and
        guards name).
    wake : str
        Its wake contract: ``"offload"`` (the default: asleep, its bytes in
        pinned host memory mapped at their own addresses, so parameters bound
        to it stay valid; the host memory is made once and reused), ``"keep"``
        (a pinned host copy; refused by a sleep while views are alive), or a
        contract that drops them (``"undefined"``: weights loaded again after
        every wake).

    Returns
    -------
    WeightSet

    Raises
    ------
    TypeError
        `params` is not a mapping or paths, a name is not a str, or a
        parameter is not described by a pair, an array or a tensor.
    ValueError
        `params` is empty, an element type or shape is not understood, a
        name is empty, a file is not a well-formed safetensors file or
        index (naming the tensor or file), or `BufferSpec` refuses `buffer`,
        `tag` or `wake`.
    """
    if _is_module(params):
        params = dict(params.named_parameters())
    paths = source_paths(params, "weight_set")
    described = []
    if paths is not None:
        for _path, e in entries_of(paths, "weight_set"):
            described.append((e.name, e.dtype, e.shape))
    elif isinstance(params, Mapping):
        for name, value in params.items():     # the names: checked by WeightSet
            dtype, shape = _described(value, f"weight_set: parameter {name!r}")
            described.append((name, dtype, shape))
    else:
        raise TypeError(f"weight_set: params must be a mapping of names to parameters, a torch "
                        f"module or safetensors paths, got {type(params).__name__}")
    if not described:
        raise ValueError("weight_set: params holds no parameter")
    return WeightSet(described, align=align, buffer=buffer, tag=tag, wake=wake)


def weight_arena(ws, gpu, *, config=None, exportable=True):
    """A reserved arena holding a `WeightSet`'s buffer (and nothing else).

    Parameters
    ----------
    ws : WeightSet
    gpu : Backend
        Where it lives (``CudaBackend`` on a GPU; ``HostBackend`` in tests).
    config : ModelConfig, optional
        The model's config, shown by the arena's summary; sizes nothing (every
        parameter's size is in the set).
    exportable : bool, optional
        Its memory made of chunks exportable as file descriptors, so that a
        trainer writes the weights in place (`metrale.refit`, docs/rl.md).

    Returns
    -------
    BufferArena
        Reserved (it sleeps and wakes, its class keeping its bytes), its
        memory mapped now.
    """
    if type(ws) is not WeightSet:
        raise TypeError(f"weight_arena: ws must be a WeightSet, got {type(ws).__name__}")
    if config is None:
        config = ModelConfig()
    elif not isinstance(config, ModelConfig):
        raise TypeError(f"weight_arena: config must be a ModelConfig, got "
                        f"{type(config).__name__}")
    sizes = BufferSizes.from_config(config, 1, 1, 1, 1, buffers=ws.buffers, env={})
    return BufferArena.from_sizes(sizes, gpu, reserve_sizes=sizes, exportable=exportable)


# -- load --------------------------------------------------------------------------------


def _check_arena(arena, ws, where):
    if type(ws) is not WeightSet:
        raise TypeError(f"{where}: ws must be a WeightSet, got {type(ws).__name__}")
    if not isinstance(arena, BufferArena):
        raise TypeError(f"{where}: arena must be a BufferArena, got {type(arena).__name__}")
    have = arena.sizes().buffers
    if ws.buffer not in have.names or have[ws.buffer] != ws.buffers[ws.buffer] or \
            arena.nbytes(ws.buffer) < ws.nbytes:
        raise MetraleError(f"{where}: the arena holds no buffer {ws.buffer!r} of this weight "
                           f"set's {ws.nbytes:,} bytes (make it with weight_arena(ws, gpu))")


def _mismatch(where, name, dtype, shape, p):
    raise ValueError(f"{where}: tensor {name!r} is {dtype} {list(shape)}, the weight set's is "
                     f"{p.dtype} {list(p.shape)}")


def _check_names(where, ws, names):
    have = set(names)       # a model's hundreds of names: not a list's scan for each
    missing = [p.name for p in ws.params if p.name not in have]
    extra = [n for n in names if n not in ws]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)}: " + ", ".join(map(repr, missing[:5]))
                         + (" ..." if len(missing) > 5 else ""))
        if extra:
            parts.append(f"not in the weight set {len(extra)}: "
                         + ", ".join(map(repr, extra[:5])) + (" ..." if len(extra) > 5 else ""))
        raise ValueError(f"{where}: the source's tensors are not the weight set's: "
                         + "; ".join(parts))


def load(arena, ws, source, *, stream=None):
    """Copy a model's weights into its weight arena.

    Every tensor of `source` is checked against the set (its name, element
    type and shape) and the set's every parameter must be in it, before a
    byte is copied; then each run of parameters that lie back to back in the
    source and in the arena is one copy.

    Parameters
    ----------
    arena : BufferArena
        Made by `weight_arena` for `ws` (awake).
    ws : WeightSet
    source : mapping, path or list of paths
        A state dict (names to numpy arrays, C-contiguous, or objects with the
        buffer protocol of exactly the parameter's bytes, each with its
        element type and shape given by the set: a ``(dtype, shape, data)``
        triple states them), or safetensors files / an index as in
        `weight_set`.
    stream : stream, optional
        For a CUDA arena: the stream the copies go on (synchronized before
        `load` returns).

    Returns
    -------
    LoadStats

    Raises
    ------
    ValueError
        A tensor is missing, extra, or of another element type or shape
        (naming it), or a file is not well formed: nothing was copied.
    MetraleError
        The arena does not hold this set, or it sleeps.
    """
    where = "load"
    _check_arena(arena, ws, where)
    if arena.is_sleeping():
        raise MetraleError(f"{where}: the weight arena sleeps: wake it first")
    paths = source_paths(source, where)
    items, keep = [], []
    if paths is not None:
        entries = entries_of(paths, where)
        _check_names(where, ws, [e.name for _p, e in entries])
        for path, e in entries:
            p = ws[e.name]
            if (e.dtype, e.shape) != (p.dtype, p.shape):
                _mismatch(where, e.name, e.dtype, e.shape, p)
            items.append((p.offset, path, e.begin, p.nbytes))
    elif isinstance(source, Mapping):
        names = list(source)
        if not all(isinstance(n, str) for n in names):
            raise TypeError(f"{where}: a tensor's name must be a str")
        _check_names(where, ws, names)
        for name in names:
            p = ws[name]
            data = _bytes_of(source[name], p, where)
            keep.append(data)
            items.append((p.offset, len(keep) - 1, 0, p.nbytes))
    else:
        raise TypeError(f"{where}: source must be a mapping of names to tensors or safetensors "
                        f"paths, got {type(source).__name__}")
    items.sort()
    runs = runs_of(items)         # a state dict's tensors: each its own source, no run merges
    sink, files = Sink(arena, ws, stream), {}
    try:
        for dst, key, src, n in runs:
            if n == 0:
                continue
            if paths is not None:
                f = files.get(key)
                if f is None:
                    f = files[key] = open(key, "rb")
                sink.read(dst, f, src, n, key)
            else:
                sink.write(dst, keep[key])
        sink.done()
    finally:
        for f in files.values():
            f.close()
    return LoadStats(len(ws.params), sum(p.nbytes for p in ws.params),
                     sum(1 for r in runs if r[3]))


def _bytes_of(value, p, where):
    """The bytes of one tensor of a state dict, checked against its parameter."""
    at = f"{where}: tensor {p.name!r}"
    if isinstance(value, tuple) and len(value) == 3:
        dtype, shape, data = value
        dtype, shape = _dtype_arg(dtype, at), _shape_arg(shape, at)
    else:
        data = value
        if _array_kind(value) == "numpy":
            dtype, shape = _described(value, at)
        else:
            raise TypeError(f"{where}: tensor {p.name!r} must be a numpy array or a (dtype, "
                            f"shape, data) triple, got {type(value).__name__}")
    if (dtype, shape) != (p.dtype, p.shape):
        _mismatch(where, p.name, dtype, shape, p)
    try:
        mv = memoryview(data)
    except TypeError:
        raise TypeError(f"{where}: tensor {p.name!r}'s data has no buffer protocol") from None
    if not mv.c_contiguous:
        raise ValueError(f"{where}: tensor {p.name!r} is not C-contiguous")
    mv = mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv
    if mv.nbytes != p.nbytes:
        raise ValueError(f"{where}: tensor {p.name!r} holds {mv.nbytes:,} bytes, its "
                         f"{p.dtype} {list(p.shape)} needs {p.nbytes:,}")
    return mv
