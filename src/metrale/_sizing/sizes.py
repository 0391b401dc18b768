"""Sizing: BufferSizes.from_config, the byte size of every buffer of a forward
pass.  The layouts it relies on have their own modules: the split-K target
(`metrale.target`) and the decode metadata (`metrale.decode_meta`).

Pure Python with exact integer arithmetic; no allocation, no GPU contact.
"""

import os
from collections.abc import Mapping

from .._base._common import check_index
from .reference import REFERENCE, buffer_set_arg
from .._base._math import U64_MAX
from .._base._record import Record
from .config import ModelConfig
from .decode_meta import (DECODE_META_MAX_ROWS, DECODE_META_MIN_ROWS, DecodeMetaLayout,
                          kv_blocks_per_seq)
from .formulas import evaluation_namespace, sizes_of
from .levers import LEVERS, lever_on
from .target import SPLITK_POLICIES, Target, _splitk_override, resolve_splitk

__all__ = [
    "BUFFER_NAMES", "BufferSizes", "DecodeMetaLayout", "SizingLimits", "Target",
    "GATEUP_FUSED_MAX_M", "DECODE_META_MIN_ROWS", "DECODE_META_MAX_ROWS",
    "Q12_SIZING_STREAMS", "VERIFY_ROW_CAP", "SPLITK_POLICIES", "resolve_splitk",
    "kv_blocks_per_seq", "REFERENCE",
]

GATEUP_FUSED_MAX_M = 16
Q12_SIZING_STREAMS = 8
VERIFY_ROW_CAP = 160

# The reference buffer names in canonical order (the numbering of docs/buffers.md).
BUFFER_NAMES = REFERENCE.names


# -- BufferSizes ---------------------------------------------------------------------

def sizing_inputs(config, max_batch_tokens, max_seq_len, kv_block_size, max_batch_size,
                  target, env):
    """The inputs of `BufferSizes.from_config`, checked and defaulted.

    The one validation rule of the sizing inputs, shared by `from_config`
    and the catalogue's second implementation of the formulas.

    Parameters
    ----------
    config : ModelConfig
        The model's shape.
    max_batch_tokens, max_seq_len, kv_block_size, max_batch_size : int
        The serving limits (`max_batch_tokens` >= 1).
    target : Target or None
        The device sized for.
    env : mapping or None
        Where the levers are read.

    Returns
    -------
    tuple
        ``(M, max_seq_len, kv_block_size, max_batch_size, target, env)``:
        the limits as ints, `target` (``Target.reference()`` for None) and
        `env` (``os.environ`` for None).

    Raises
    ------
    TypeError
        `config` is not a ModelConfig, `target` not a Target or None, `env`
        not a mapping or None, or a limit not an int.
    ValueError
        A limit is negative or does not fit 64 bits, or `max_batch_tokens` is 0.
    """
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
    if target is None:
        target = Target.reference()
    elif not isinstance(target, Target):
        raise TypeError(f"target must be a Target or None, got {type(target).__name__}")
    if env is None:
        env = os.environ
    elif not callable(getattr(env, "get", None)):
        # Only env.get is used; a Mapping ABC check would import collections.
        raise TypeError(f"env must be a mapping or None, got {type(env).__name__}")
    return (check_index(max_batch_tokens, "max_batch_tokens", 1),
            check_index(max_seq_len, "max_seq_len"),
            check_index(kv_block_size, "kv_block_size"),
            check_index(max_batch_size, "max_batch_size"), target, env)


class SizingLimits(Record):
    """The limits a `BufferSizes` was computed for (``sizes.limits``).

    Parameters
    ----------
    max_batch_tokens, max_seq_len, kv_block_size, max_batch_size : int
        The serving limits given to `BufferSizes.from_config`.
    tp_size : int
        The tensor-parallel ranks the sizes are per-rank sizes for (1: the
        whole model).

    Attributes
    ----------
    max_batch_tokens, max_seq_len, kv_block_size, max_batch_size, tp_size : int
        As given.
    """

    __slots__ = ("max_batch_tokens", "max_seq_len", "kv_block_size", "max_batch_size",
                 "tp_size")


class BufferSizes(Mapping):
    """The byte size of each buffer of one forward pass.

    A read-only mapping of buffer name to bytes in the order of its buffer
    set (``sizes["logits"]``, ``dict(sizes)``, ``len(sizes)``), and one int
    attribute per buffer (``sizes.logits``).  Immutable; `replace` makes a
    changed copy.  Usually made by `from_config`, which records what it was
    given: the set (`buffers`), the limits (`limits`), one rank's shape
    (`config`) and the device (`target`), so that what is made from the
    sizes (``plan_layout(sizes)``, ``BufferArena.from_sizes(sizes, gpu)``)
    needs nothing else.  ``BufferSizes(**sizes)`` takes the 46 sizes of
    `REFERENCE`, and ``BufferSizes(buffers, **sizes)`` those of another set,
    with no limits, config or target.
    Two values are equal when their sets and sizes are.

    Parameters
    ----------
    buffers : BufferSet, optional
        The set the sizes are for (positional only; default `REFERENCE`).
    **sizes : int
        Bytes of every buffer of the set, by name.

    Raises
    ------
    TypeError
        An entry is missing, unknown, or not an int; `buffers` not a BufferSet.
    ValueError
        An entry is negative or does not fit 64 bits.
    """

    __slots__ = ("_set", "_values", "_levers", "_limits", "_config", "_target")

    def __init__(self, buffers=None, /, **sizes):
        buffers = buffer_set_arg(buffers)
        missing = [n for n in buffers.names if n not in sizes]
        if missing:
            raise TypeError(f"BufferSizes() missing entries: {', '.join(missing)}")
        self._set = buffers
        self._values = _validated(buffers, sizes)
        self._levers = {}
        self._limits = self._config = self._target = None

    @classmethod
    def _make(cls, values, levers=None, limits=None, buffers=None, config=None, target=None):
        self = object.__new__(cls)
        self._set = REFERENCE if buffers is None else buffers
        self._values = values
        self._levers = levers or {}
        self._limits = limits
        self._config = config
        self._target = target
        return self

    @property
    def buffers(self):
        """The buffer set these sizes are for (`BufferSet`; `REFERENCE` unless
        another was given)."""
        return self._set

    @property
    def limits(self):
        """The limits these sizes were computed for.

        Returns
        -------
        SizingLimits or None
            ``max_batch_tokens``, ``max_seq_len``, ``kv_block_size``,
            ``max_batch_size`` and ``tp_size`` as given to `from_config`
            (kept by `replace` and by pickling); None for sizes built by
            hand (``BufferSizes(**sizes)``).
        """
        return self._limits

    @property
    def config(self):
        """The model shape these sizes were computed for.

        Returns
        -------
        ModelConfig or None
            One rank's shape (``config.shard(tp_size)`` of the config given
            to `from_config`; the whole model for ``tp_size=1``), kept by
            `replace` and by pickling; None for sizes built by hand.
        """
        return self._config

    @property
    def target(self):
        """The device these sizes were computed for.

        Returns
        -------
        Target or None
            As given to `from_config` (``Target.reference()`` for None);
            None for sizes built by hand.
        """
        return self._target

    # -- the mapping: name -> bytes, in the set's order ------------------------------
    def __getitem__(self, name):
        i = self._set._index.get(name) if isinstance(name, str) else None
        if i is None:
            raise KeyError(name)
        return self._values[i]

    def __iter__(self):
        return iter(self._set.names)

    def __len__(self):
        return len(self._values)

    def __contains__(self, name):
        return isinstance(name, str) and name in self._set._index

    def __getattr__(self, name):
        # The buffers of a set other than REFERENCE (whose names are properties).
        i = self._set._index.get(name) if not name.startswith("_") else None
        if i is None:
            raise AttributeError(f"'BufferSizes' object has no attribute {name!r} (no buffer "
                                 "of that name in its set)")
        return self._values[i]

    def levers(self):
        """The environment levers in effect when these sizes were computed.

        Returns
        -------
        dict of str to str
            Lever name -> how it was set (``"1"``, a split-K value, or
            ``"quantization_config"``), for the levers that were on or
            overrode the target; empty for sizes not made by `from_config`.
        """
        return dict(self._levers)

    @classmethod
    def from_config(cls, config, max_batch_tokens, max_seq_len, kv_block_size,
                    max_batch_size, *, target=None, env=None, tp_size=1, buffers=None):
        """The size of every buffer for a model and its serving limits.

        Pure integer arithmetic: nothing is allocated and no GPU is touched;
        the same arguments and lever values always give equal sizes.  Each
        size is its spec's formula (`BufferSpec.formula`; the reference
        ones are in docs/buffers.md) evaluated for these inputs.

        Parameters
        ----------
        config : ModelConfig
            The model shape.
        max_batch_tokens : int
            M, the most tokens one forward pass carries (>= 1).
        max_seq_len : int
            The longest sequence the KV cache serves, in tokens.
        kv_block_size : int
            Tokens per paged-KV block; 0 sizes the block tables for 256
            blocks per sequence.
        max_batch_size : int
            The most sequences one batched decode step carries; the decode
            metadata holds at least 32 rows.
        target : Target, optional
            The device the split-K workspace is sized for; None means
            `Target.reference`.  ``BufferArena.new`` passes ``gpu.target()``.
        env : mapping, optional
            Where the environment levers are read (only ``env.get`` is
            called); None means ``os.environ``.  See `metrale.levers`.
        tp_size : int, optional
            Size what one rank of a tensor-parallel group of `tp_size` ranks
            holds (default 1, the whole model): the sizes of
            ``config.shard(tp_size)`` (`ModelConfig.shard`,
            docs/tensor-parallel.md).
        buffers : BufferSet, optional
            The buffers to size (docs/buffer-sets.md); None means `REFERENCE`.

        Returns
        -------
        BufferSizes
            One size per buffer of the set; `levers` tells which levers were
            in effect and `limits` the limits given.

        Raises
        ------
        TypeError
            `config` is not a ModelConfig, `target` not a Target or None,
            `env` has no ``get``, `buffers` not a BufferSet, or an integer
            argument is not an int.
        ValueError
            `max_batch_tokens` or `tp_size` is 0, an integer argument is
            negative or does not fit 64 bits, a size `tp_size` divides is
            not a multiple of it (the message names the field), or a
            buffer's size is negative, divides by zero, or it or the sum of
            all sizes exceeds 2**64 - 1 (the message names the buffer and
            max_batch_tokens).
        """
        buffers = buffer_set_arg(buffers)
        M, max_seq_len, kv_block_size, max_batch_size, target, env = sizing_inputs(
            config, max_batch_tokens, max_seq_len, kv_block_size, max_batch_size, target, env)
        tp = check_index(tp_size, "tp_size", 1)
        config = config.shard(tp)
        ns = evaluation_namespace(config, M, max_seq_len, kv_block_size, max_batch_size, target,
                                  env, tp)
        values = sizes_of(buffers, ns)
        levers = {}
        for lv in LEVERS:
            raw = env.get(lv.name)
            if lv.name == "METRALE_ATTN_DECODE_SPLITK":
                if _splitk_override(raw) is not None:      # an ignored value is no lever
                    levers[lv.name] = raw
            elif lever_on(lv.name, env, config):
                levers[lv.name] = "1" if raw is not None else "quantization_config"
        total = 0
        for name, v in zip(buffers.names, values):
            total += v
            if v > U64_MAX:
                raise ValueError(f"size of {name} ({v} bytes) exceeds 2^64 - 1 "
                                 f"at max_batch_tokens={M}")
        if total > U64_MAX:
            raise ValueError(f"the sum of all buffer sizes ({total} bytes) exceeds "
                             f"2^64 - 1 at max_batch_tokens={M}")
        return cls._make(values, levers,
                         SizingLimits(M, max_seq_len, kv_block_size, max_batch_size, tp),
                         buffers, config, target)

    def total_bytes(self):
        """The bytes the reference engine's memory preflight reserves.

        The sum of the sizes of the buffers whose spec counts them
        (`BufferSpec.total`): for `REFERENCE`, 44 of the 46, every buffer
        except ``o_latent`` and ``norm_unit_w``, for parity with the
        reference engine.  The arena allocates more: every buffer and the
        placement padding (``arena.slab_bytes()``).

        Returns
        -------
        int
            The sum, in bytes.
        """
        v = self._values
        return sum(v[i] for i in _totalled(self._set))

    def as_dict(self):
        """The sizes as a new dict.

        Returns
        -------
        dict of str to int
            Buffer name -> bytes, in the set's order.
        """
        return dict(zip(self._set.names, self._values))

    def as_tuple(self):
        """The sizes as a tuple.

        Returns
        -------
        tuple of int
            The sizes in the set's order (for `REFERENCE`, the order of
            ``BUFFER_NAMES``).
        """
        return self._values

    def replace(self, **changes):
        """A copy with some sizes changed.

        Parameters
        ----------
        **changes : int
            New bytes for buffers, by name.

        Returns
        -------
        BufferSizes
            A new value; this one is unchanged.  Its `buffers`, `levers` and
            `limits` are this one's.

        Raises
        ------
        TypeError
            A name that is not a buffer of the set, or a size that is not an int.
        ValueError
            A size that is negative or does not fit 64 bits.
        """
        values = dict(zip(self._set.names, self._values))
        for name, v in changes.items():
            if name not in values:
                raise TypeError(f"BufferSizes has no entry {name!r}")
            values[name] = v
        return BufferSizes._make(_validated(self._set, values), self._levers, self._limits,
                                 self._set, self._config, self._target)

    def __eq__(self, other):
        if type(other) is not BufferSizes:
            return NotImplemented
        return self._values == other._values and self._set == other._set

    def __hash__(self):
        return hash(self._values)

    def __reduce__(self):
        return (BufferSizes._make, (self._values, self._levers, self._limits, self._set,
                                    self._config, self._target))

    def __repr__(self):
        sizes = ", ".join(f"{n}={v}" for n, v in zip(self._set.names, self._values))
        if self._set is REFERENCE:
            return f"BufferSizes({sizes})"
        return f"BufferSizes({self._set!r}, {sizes})"


def _validated(buffers, sizes):
    extra = set(sizes) - set(buffers.names)
    if extra:
        raise TypeError(f"BufferSizes has no entry {sorted(map(str, extra))[0]!r}")
    return tuple(check_index(sizes[name], f"size of {name}") for name in buffers.names)


def _totalled(buffers):
    ids = buffers._cache.get("totalled")
    if ids is None:
        ids = buffers._cache["totalled"] = tuple(i for i, s in enumerate(buffers) if s.total)
    return ids


for _i, _name in enumerate(BUFFER_NAMES):
    setattr(BufferSizes, _name, property(
        lambda self, _name=_name, _i=_i: self._values[_i] if self._set is REFERENCE
        else self.__getattr__(_name),
        doc=f"Bytes of the ``{_name}`` buffer (int); what it holds and its formula: "
            f"docs/buffers.md#{_name}."))
del _i, _name
