"""Sizing: BufferSizes.from_config, the byte size of every buffer of a forward
pass, and the layouts it relies on (the split-K target, the decode metadata).

Pure Python with exact integer arithmetic; no allocation, no GPU contact.
"""

import os
from collections.abc import Mapping

from ._buffers import BUFFER_INDEX, BUFFER_NAMES, GROUPS
from ._common import check_index
from ._math import U64_MAX, cdiv, ceil_to
from ._record import Record
from .config import ModelConfig
from .levers import LEVERS, lever_on
from .moe import moe_fp8_layout

__all__ = [
    "BUFFER_NAMES", "BufferSizes", "DecodeMetaLayout", "SizingLimits", "Target",
    "GATEUP_FUSED_MAX_M", "DECODE_META_MIN_ROWS", "DECODE_META_MAX_ROWS",
    "Q12_SIZING_STREAMS", "VERIFY_ROW_CAP", "SPLITK_POLICIES", "resolve_splitk",
    "kv_blocks_per_seq",
]

GATEUP_FUSED_MAX_M = 16
DECODE_META_MIN_ROWS = 32
DECODE_META_MAX_ROWS = 128
Q12_SIZING_STREAMS = 8
VERIFY_ROW_CAP = 160

_DECODE_META_OFFSET = 32_768   # batched decode / verify metadata inside `scratch`
# The int32 token count StepInputs uploads: the last 16 bytes before the decode
# metadata, inside the 32 KiB the sizing reserves ahead of it.
_STEP_COUNT_OFFSET = _DECODE_META_OFFSET - 16
_SCRATCH_FLOOR = 65_536
_FLOOR = 256
_Q8_SLACK = 1 << 20
_MAX_DECODE_SPLITS = 16
_SPLITK_TARGET_WAVES = 2

# The buffer names in canonical order (the numbering of docs/buffers.md), index
# i being buffer id i of the C core, and which ones total_bytes() counts: from
# the buffer table (src/buffers.h), through the module generated from it.
_TOTALLED = tuple(BUFFER_INDEX[n] for n in GROUPS["total"])


# -- Target and split-K ---------------------------------------------------------

_PINNED = tuple(str(n) for n in range(1, _MAX_DECODE_SPLITS + 1))
# Every value Target.splitk takes: the two policies, then the pinned counts.
SPLITK_POLICIES = ("legacy", "auto") + _PINNED


class Target(Record):
    """The device an arena is sized for: its SM count and split-K policy.

    The split-K decode attention keeps one float32 slot of ``head_dim + 2``
    values per (sequence, query head, split) in ``splitk_workspace``; the
    target decides how many slots, and so that buffer's size.  A backend's
    ``target()`` describes its device.  The METRALE_ATTN_DECODE_SPLITK
    variable overrides the policy (see `resolve_splitk`).

    Parameters
    ----------
    sm_count : int
        Streaming multiprocessors of the device (>= 0).
    splitk : str
        ``"legacy"`` (one slot per SM, whatever the batch),
        ``"auto"`` (splits from the SM count and the query heads, for up to
        the widest decode batch), or a pinned split count ``"1"`` ... ``"16"``.

    Attributes
    ----------
    sm_count : int
        As given.
    splitk : str
        As given.

    Raises
    ------
    TypeError
        `sm_count` is not an int or `splitk` is not a str.
    ValueError
        `sm_count` is negative or does not fit 64 bits, or `splitk` is not
        one of the policies above.
    """

    __slots__ = ("sm_count", "splitk")

    def __init__(self, sm_count, splitk):
        sm_count = check_index(sm_count, "sm_count")
        if not isinstance(splitk, str):
            raise TypeError(f"splitk must be a str, got {type(splitk).__name__}")
        if splitk not in SPLITK_POLICIES:
            raise ValueError(f"splitk must be 'legacy', 'auto' or '1' ... '16', got {splitk!r}")
        super().__init__(sm_count, splitk)

    @classmethod
    def reference(cls):
        """The reference build target: 48 SMs, legacy split-K.

        What `BufferSizes.from_config` uses when no target is given, and
        what ``HostBackend().target()`` returns.

        Returns
        -------
        Target
            ``Target(48, "legacy")``.
        """
        return cls(48, "legacy")


def resolve_splitk(target, env):
    """The split-K policy in effect for `target` under `env`.

    ``METRALE_ATTN_DECODE_SPLITK`` in `env`, trimmed and lower-cased,
    overrides ``target.splitk``: ``"legacy"`` and ``"auto"`` select those
    policies, ``"0"``, ``"off"``, ``"false"`` and ``"no"`` pin one split, a
    decimal count n >= 1 pins n splits, and any other value is ignored.  An
    engine that launches the split-K decode attention should resolve its
    policy with this function too, so that the launch and the workspace
    always agree.

    Parameters
    ----------
    target : Target
        The device's target.
    env : mapping
        Where the variable is read; only ``env.get`` is called.

    Returns
    -------
    tuple of (str, int)
        ``("legacy", 0)``, ``("auto", 0)`` or ``("pinned", n)``.  A pinned n
        is not clamped here; the sizing uses at most 16 splits.
    """
    policy = _splitk_override(env.get("METRALE_ATTN_DECODE_SPLITK")) or target.splitk
    if policy in ("legacy", "auto"):
        return policy, 0
    return "pinned", int(policy)


def _splitk_override(raw):
    """The policy a METRALE_ATTN_DECODE_SPLITK value selects, or None when
    the value is ignored."""
    if not isinstance(raw, str):
        return None
    v = raw.strip().lower()
    if v in ("legacy", "auto"):
        return v
    if v in ("0", "off", "false", "no"):
        return "1"
    if v.isascii() and v.isdigit() and v.strip("0"):
        v = v.lstrip("0")
        # A count past any split count pins the most the sizing uses; int()
        # of thousands of digits would raise instead.
        return v if len(v) <= 4 else str(_MAX_DECODE_SPLITS)
    return None


def splitk_slots(target, env, num_heads, rows):
    """Slots of the split-K workspace (each ``head_dim + 2`` float32 values).

    Parameters
    ----------
    target : Target
        The device's target.
    env : mapping
        Where METRALE_ATTN_DECODE_SPLITK is read (only ``env.get`` is called).
    num_heads : int
        Query heads.
    rows : int
        The widest decode batch (the decode metadata's rows).

    Returns
    -------
    int
        ``max(sm_count, 1)`` under the legacy policy; otherwise
        rows x heads x splits (at least 1 of each), with at most 16 splits.
    """
    policy, n = resolve_splitk(target, env)
    if policy == "legacy":
        return max(target.sm_count, 1)
    heads = max(num_heads, 1)
    if policy == "auto":
        n = cdiv(_SPLITK_TARGET_WAVES * target.sm_count, heads)
    splits = min(max(n, 1), _MAX_DECODE_SPLITS)
    return max(rows, 1) * heads * splits


# -- DecodeMetaLayout ------------------------------------------------------------

class DecodeMetaLayout:
    """Byte layout of the batched-decode metadata upload.

    The engine uploads one packed table per batched decode step, at offset
    32,768 of the ``scratch`` buffer: for each of the R rows the position
    (uint32), the LoRA slot (int32), the KV slot (int64) and the sequence
    length (int32), each as one array of R entries, then, after an unused
    gap of 4R bytes, the block table (int32, R rows of ``max_blocks``).  An
    arena keeps the layout of the ``max_batch_size`` it was built for
    (``arena.decode_meta()``).  Layouts compare and hash by their rows.

    Parameters
    ----------
    rows : int
        R, the widest padded batch the upload holds (>= 0), taken as is;
        `for_max_batch_size` applies the 32-row floor.

    Raises
    ------
    TypeError
        `rows` is not an int.
    ValueError
        `rows` is negative or does not fit 64 bits.
    """

    __slots__ = ("_rows",)

    def __init__(self, rows):
        self._rows = check_index(rows, "rows")

    @classmethod
    def for_max_batch_size(cls, n):
        """The layout for batches of up to `n` sequences.

        Parameters
        ----------
        n : int
            The serving limit on sequences per decode step (>= 0).

        Returns
        -------
        DecodeMetaLayout
            The layout of ``max(n, DECODE_META_MIN_ROWS)`` rows.  Only the
            32-row floor applies: DECODE_META_MAX_ROWS is a ceiling for front
            ends to enforce, not a clamp.

        Raises
        ------
        TypeError
            `n` is not an int.
        ValueError
            `n` is negative or does not fit 64 bits.
        """
        n = check_index(n, "max_batch_size")
        return cls(max(n, DECODE_META_MIN_ROWS))

    def rows(self):
        """R, the rows the upload holds.

        Returns
        -------
        int
            The widest padded batch.
        """
        return self._rows

    def positions_offset(self):
        """Byte offset of the positions (uint32, R entries).

        Returns
        -------
        int
            Always 0.
        """
        return 0

    def seq_slot_offset(self):
        """Byte offset of the per-sequence LoRA slots (int32, R entries).

        Returns
        -------
        int
            4R.
        """
        return 4 * self._rows

    def slots_offset(self):
        """Byte offset of the KV slots (int64, R entries; 8-byte aligned).

        Returns
        -------
        int
            8R.
        """
        return 8 * self._rows

    def seq_lens_offset(self):
        """Byte offset of the sequence lengths (int32, R entries).

        Returns
        -------
        int
            16R.
        """
        return 16 * self._rows

    def block_table_offset(self):
        """Byte offset of the block table (int32, R rows of max_blocks).

        The 4R bytes before it, after the sequence lengths, are unused.

        Returns
        -------
        int
            24R.
        """
        # 4R gap after the sequence lengths, as the reference packs it.
        return 24 * self._rows

    def meta_bytes(self, max_blocks):
        """Size of the whole upload for a block table `max_blocks` wide.

        Parameters
        ----------
        max_blocks : int
            KV blocks per sequence in the block table (>= 0).

        Returns
        -------
        int
            ``24 * R + 4 * R * max_blocks``.

        Raises
        ------
        TypeError
            `max_blocks` is not an int.
        ValueError
            `max_blocks` is negative or does not fit 64 bits.
        """
        max_blocks = check_index(max_blocks, "max_blocks")
        return 24 * self._rows + 4 * self._rows * max_blocks

    def __eq__(self, other):
        if type(other) is not DecodeMetaLayout:
            return NotImplemented
        return self._rows == other._rows

    def __hash__(self):
        return hash(("DecodeMetaLayout", self._rows))

    def __repr__(self):
        return f"DecodeMetaLayout(rows={self._rows})"


def kv_blocks_per_seq(max_seq_len, kv_block_size):
    """KV blocks per sequence in the block tables (B).

    Parameters
    ----------
    max_seq_len : int
        Longest sequence the KV cache serves.
    kv_block_size : int
        Tokens per paged-KV block; 0 means 256 blocks.

    Returns
    -------
    int
        ``max_seq_len // kv_block_size + 1``, or 256 when `kv_block_size` is 0.
    """
    return 256 if kv_block_size == 0 else max_seq_len // kv_block_size + 1


# -- scratch -----------------------------------------------------------------------

def _q12(n, c, k, ps):
    t = n * c
    return (ceil_to(8 * t * k, 64) + n * max(16 * c + 64, 4096) + ps * ceil_to(4 * t, 8)
            + ceil_to(8 * t, 8) + 2 * ceil_to(8 * n, 8) + ceil_to(4 * (n + 1), 8)
            + ceil_to(4 * n, 8) + 8 * n)


def scratch_terms(config, M, B, R):
    """The three layouts that share the ``scratch`` buffer, in bytes.

    ``scratch`` is the largest of these (and at least 64 KiB): the prefill
    routing and metadata, the batched decode / verify metadata (at offset
    32,768), and the staging of the kernel-batched prefill over 8 streams.

    Parameters
    ----------
    config : ModelConfig
        The model shape (its top-k and M-RoPE streams are read).
    M : int
        max_batch_tokens.
    B : int
        KV blocks per sequence in the block tables.
    R : int
        Rows of the decode metadata.

    Returns
    -------
    tuple of int
        ``(prefill_term, decode_term, q12_term)``.
    """
    k = config.num_experts_per_tok
    ps = 3 if config.mrope_interleaved else 1
    o_s = ceil_to(4 * ps * M, 8)
    o_b = ceil_to(o_s + 8 * M, 4)
    o_l = ceil_to(o_b + 4 * B, 4)
    prefill = 8 * M * k + o_l + 4
    decode = _DECODE_META_OFFSET + max(24 * VERIFY_ROW_CAP + VERIFY_ROW_CAP * B * 4,
                                       24 * R + R * B * 4)
    q12 = _q12(Q12_SIZING_STREAMS, max(cdiv(M, Q12_SIZING_STREAMS), 1), k, ps)
    return prefill, decode, q12


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
    """The byte size of each of the 46 buffers of one forward pass.

    One int attribute per buffer (``sizes.logits``), and a read-only mapping
    of buffer name to bytes in canonical order (``sizes["logits"]``,
    ``dict(sizes)``, ``len(sizes) == 46``).  Immutable; `replace` makes a
    changed copy.  Usually made by `from_config`, which records the limits
    it was given (`limits`); ``BufferSizes(**sizes)`` takes all 46 entries
    and has no limits.  Two values are equal when their 46 sizes are.

    Parameters
    ----------
    **sizes : int
        Bytes of every buffer, by name (all 46 names).

    Raises
    ------
    TypeError
        An entry is missing, unknown, or not an int.
    ValueError
        An entry is negative or does not fit 64 bits.
    """

    __slots__ = ("_values", "_levers", "_limits")

    def __init__(self, **sizes):
        missing = [n for n in BUFFER_NAMES if n not in sizes]
        if missing:
            raise TypeError(f"BufferSizes() missing entries: {', '.join(missing)}")
        self._values = _validated(sizes)
        self._levers = {}
        self._limits = None

    @classmethod
    def _make(cls, values, levers=None, limits=None):
        self = object.__new__(cls)
        self._values = values
        self._levers = levers or {}
        self._limits = limits
        return self

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

    # -- the mapping: name -> bytes, in canonical order ----------------------------
    def __getitem__(self, name):
        i = BUFFER_INDEX.get(name) if isinstance(name, str) else None
        if i is None:
            raise KeyError(name)
        return self._values[i]

    def __iter__(self):
        return iter(BUFFER_NAMES)

    def __len__(self):
        return len(BUFFER_NAMES)

    def __contains__(self, name):
        return isinstance(name, str) and name in BUFFER_INDEX

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
                    max_batch_size, *, target=None, env=None, tp_size=1):
        """The size of every buffer for a model and its serving limits.

        Pure integer arithmetic: nothing is allocated and no GPU is touched;
        the same arguments and lever values always give equal sizes.  The
        formulas are in docs/buffers.md.

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

        Returns
        -------
        BufferSizes
            The 46 sizes; `levers` tells which levers were in effect and
            `limits` the limits given.

        Raises
        ------
        TypeError
            `config` is not a ModelConfig, `target` not a Target or None,
            `env` has no ``get``, or an integer argument is not an int.
        ValueError
            `max_batch_tokens` or `tp_size` is 0, an integer argument is
            negative or does not fit 64 bits, a size `tp_size` divides is
            not a multiple of it (the message names the field), or a
            buffer's size or the sum of all sizes exceeds 2**64 - 1 (the
            message names the buffer and max_batch_tokens).
        """
        M, max_seq_len, kv_block_size, max_batch_size, target, env = sizing_inputs(
            config, max_batch_tokens, max_seq_len, kv_block_size, max_batch_size, target, env)
        tp = check_index(tp_size, "tp_size", 1)
        config = config.shard(tp)
        values = _compute(config, M, max_seq_len, kv_block_size, max_batch_size, target, env)
        levers = {}
        for lv in LEVERS:
            raw = env.get(lv.name)
            if lv.name == "METRALE_ATTN_DECODE_SPLITK":
                if _splitk_override(raw) is not None:      # an ignored value is no lever
                    levers[lv.name] = raw
            elif lever_on(lv.name, env, config):
                levers[lv.name] = "1" if raw is not None else "quantization_config"
        total = 0
        for name, v in zip(BUFFER_NAMES, values):
            total += v
            if v > U64_MAX:
                raise ValueError(f"size of {name} ({v} bytes) exceeds 2^64 - 1 "
                                 f"at max_batch_tokens={M}")
        if total > U64_MAX:
            raise ValueError(f"the sum of all buffer sizes ({total} bytes) exceeds "
                             f"2^64 - 1 at max_batch_tokens={M}")
        return cls._make(values, levers,
                         SizingLimits(M, max_seq_len, kv_block_size, max_batch_size, tp))

    def total_bytes(self):
        """The bytes the reference engine's memory preflight reserves.

        The sum of 44 of the 46 sizes: every buffer except ``o_latent`` and
        ``norm_unit_w``, for parity with the reference engine.  The arena
        allocates more: those two buffers and the 256-byte placement padding
        (``arena.slab_bytes()``).

        Returns
        -------
        int
            The sum, in bytes.
        """
        v = self._values
        return sum(v[i] for i in _TOTALLED)

    def as_dict(self):
        """The sizes as a new dict.

        Returns
        -------
        dict of str to int
            Buffer name -> bytes, all 46 in canonical order.
        """
        return dict(zip(BUFFER_NAMES, self._values))

    def as_tuple(self):
        """The sizes as a tuple.

        Returns
        -------
        tuple of int
            The 46 sizes in canonical order (the order of ``BUFFER_NAMES``).
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
            A new value; this one is unchanged.  Its `levers` and `limits`
            are this one's.

        Raises
        ------
        TypeError
            A name that is not a buffer, or a size that is not an int.
        ValueError
            A size that is negative or does not fit 64 bits.
        """
        values = list(self._values)
        for name, v in changes.items():
            i = BUFFER_INDEX.get(name)
            if i is None:
                raise TypeError(f"BufferSizes has no entry {name!r}")
            values[i] = v
        return BufferSizes._make(_validated(dict(zip(BUFFER_NAMES, values))), self._levers,
                                 self._limits)

    def __eq__(self, other):
        if type(other) is not BufferSizes:
            return NotImplemented
        return self._values == other._values

    def __hash__(self):
        return hash(self._values)

    def __reduce__(self):
        return (BufferSizes._make, (self._values, self._levers, self._limits))

    def __repr__(self):
        return "BufferSizes(" + ", ".join(f"{n}={v}" for n, v in zip(BUFFER_NAMES, self._values)) + ")"


def _validated(sizes):
    extra = set(sizes) - set(BUFFER_NAMES)
    if extra:
        raise TypeError(f"BufferSizes has no entry {sorted(map(str, extra))[0]!r}")
    return tuple(check_index(sizes[name], f"size of {name}") for name in BUFFER_NAMES)


for _i, _name in enumerate(BUFFER_NAMES):
    setattr(BufferSizes, _name, property(lambda self, _i=_i: self._values[_i],
                                         doc=f"Bytes of the ``{_name}`` buffer (int); what it holds "
                                             f"and its formula: docs/buffers.md#{_name}."))
del _i, _name


def _compute(c, M, max_seq_len, kv_block_size, max_batch_size, target, env):
    Mp = ceil_to(M, 16)
    Kx = ceil_to(max(M, 3), 16)
    R = max(DECODE_META_MIN_ROWS, max_batch_size)
    B = kv_blocks_per_seq(max_seq_len, kv_block_size)
    H, I, V = c.hidden_size, c.intermediate_size, c.vocab_size
    Hq, Hkv, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    g = 2 if c.attn_gated else 1
    E, k, Im, Is = c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, \
        c.shared_expert_intermediate_size
    Ez, Lm, Hin = c.zero_expert_num, c.moe_latent_size, c.moe_input_size()
    nv, dk, dv = c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    QKVZ, Vd = c.ssm_qkvz_size(), nv * dv
    Hm, Di, Dx, Dip = c.mamba_num_heads, c.mamba2_d_inner(), c.mamba2_d_xbc(), c.mamba2_in_proj_size()
    KVr, Qr, r = c.kv_lora_rank, c.q_lora_rank, c.qk_rope_head_dim
    mla = KVr > 0
    hc, hr = c.hc_mult, c.hc_lowrank
    nh, hdi, topk, icr = c.index_n_heads, c.index_head_dim, c.index_topk, c.index_compress_ratio
    rank = c.adapter_max_rank
    Kf = max(H, I)
    Kp = max(H, Hq * D, Di, Vd)
    dense = E == 0

    s = {}
    s["hidden_states"] = s["residual"] = 2 * M * H
    s["norm_output"] = 2 * M * max(H, Di)
    s["qkv_output"] = 2 * Mp * (g * Hq + 2 * Hkv) * D
    s["attn_output"] = 2 * M * max(Hq * D, Di, Hq * (KVr + r) if mla else 0)
    s["gate_logits"] = _FLOOR if dense else 2 * M * (E + Ez)
    s["gate_logits_f32"] = _FLOOR if dense else 4 * M * (E + Ez)
    s["moe_router_in_f32"] = _FLOOR if dense else 4 * M * H
    s["moe_output"] = 2 * Mp * H
    s["logits"] = 2 * min(M, max(VERIFY_ROW_CAP, R + 1)) * V
    s["ssm_qkvz"] = max(2 * Mp * QKVZ, 2 * M * Dip, 2 * (M + Mp) * Hkv * D, 2 * M * Is, _FLOOR)
    s["ssm_ba"] = max(4 * M * nv, 2 * M * Lm, 2 * M * max(r, Qr) if mla else 0, _FLOOR)
    s["ssm_deinterleaved"] = max(2 * Mp * QKVZ, 2 * M * Dx, 2 * M * Hq * D,
                                 2 * M * Hq * (KVr + r) if mla else 0, _FLOOR)
    s["ssm_gates"] = max(8 * M * nv, _FLOOR)
    s["ssm_conv_out_f32"] = max(4 * M * QKVZ, 2 * M * Hq * r if mla else 0, _FLOOR)
    s["scratch"] = max(_SCRATCH_FLOOR, *scratch_terms(c, M, B, R))
    w = I if dense else max(k * Im, I)
    s["expert_gate_out"] = s["expert_up_out"] = 2 * Kx * w
    s["expert_down_out"] = 2 * Kx * H if dense else 2 * Kx * k * Hin
    s["splitk_workspace"] = 4 * (D + 2) * splitk_slots(target, env, Hq, R)
    s["o_latent"] = max(2 * M * c.o_groups * c.o_lora_rank, _FLOOR)
    s["norm_unit_w"] = 2 * max(H, Di)
    if hc > 0:
        s["hc_streams"] = 4 * M * hc * H
        s["hc_post"] = max(4 * M * hc, _FLOOR)
        s["hc_comb"] = max(4 * M * hc * hc, _FLOOR)
    else:
        s["hc_streams"] = s["hc_post"] = s["hc_comb"] = _FLOOR
    if hc > 0 and hr > 0:
        s["hc_lowrank_scratch"] = max(4 * min(M, 64) * (hc * H + hr),
                                      2 * min(M, 2048) * (2 * hc * H + hr + hc))
    else:
        s["hc_lowrank_scratch"] = _FLOOR
    if topk > 0 and icr > 0:
        s["qsa_select_scratch"] = 2048 * (2 * (nh + 1) * hdi + 4 * nh * hdi
                                          + 4 * cdiv(max_seq_len, icr) + 4 * (topk // icr))
    else:
        s["qsa_select_scratch"] = _FLOOR
    if Hm > 0 and c.ssm_state_size > 0:
        nc = cdiv(M, 64) + 1
        G = max(c.n_groups, 1)
        s["ssd_scratch"] = 2 * (Hm * nc * 64 * 4) + nc * G * 64 * 64 * 4
    else:
        s["ssd_scratch"] = 0
    if nv > 0 and dk == 128 and dv == 128:
        X = (cdiv(M, 64) + 16) * nv
        s["gdn_fla_scratch"] = (2 * X * 64 * dk + 2 * X * 64 * dv + 2 * X * dk * dv
                                + 2 * X * 64 * dv + 4 * X * 64)
    else:
        s["gdn_fla_scratch"] = 0
    s["token_ids"] = max(4 * M, _FLOOR)
    if dense:
        s["ffn_act_q8"] = 4 * M * ceil_to(Kf, 256) + _Q8_SLACK
        s["ffn_act_a"] = Mp * Kf
        s["ffn_act_scale"] = 4 * Mp * (Kf // 32)          # floor, as the reference
        s["ffn_act_scale_kmajor"] = 4 * Mp * (Kf // 128)
        s["ffn_gate_up_fused"] = 2 * ceil_to(GATEUP_FUSED_MAX_M, 16) * 2 * I
    else:
        for n in ("ffn_act_q8", "ffn_act_a", "ffn_act_scale", "ffn_act_scale_kmajor",
                  "ffn_gate_up_fused"):
            s[n] = 0
    s["fp8_act"] = Mp * Kp
    s["moe_fp8_scratch"] = moe_fp8_layout(c, M).bytes
    s["fp8_act_scale"] = s["fp8_act_scale_kmajor"] = 4 * Mp * cdiv(Kp, 128)   # ceiling
    s["q2_dequant_scratch"] = (2 * H * max(I, QKVZ, Dip, g * Hq * D, 2 * Hkv * D)
                               if lever_on("METRALE_GGUF_NATIVE_Q2", env, c) else 0)
    if rank > 0:
        s["lora_xa"] = 2 * M * rank
        s["lora_delta"] = 2 * M * max(H, I, g * Hq * D)
        s["lora_hact"] = 2 * M * I
        s["lora_seq_slot"] = 4 * M
    else:
        s["lora_xa"] = s["lora_delta"] = s["lora_hact"] = s["lora_seq_slot"] = 0
    s["q2_act_q8"] = (4 * M * ceil_to(max(H, I, Hq * D), 256) + _Q8_SLACK
                      if lever_on("METRALE_GGUF_NATIVE_Q2_MMQ", env, c) else 0)
    s["ssm_rowwise_w_bf16"] = (c.num_ssm_layers() * (2 * QKVZ * H + 2 * H * Vd)
                               if lever_on("METRALE_FP8_ROWWISE", env, c) else 0)
    return tuple(s[n] for n in BUFFER_NAMES)
