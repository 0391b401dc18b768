"""Sizing: BufferSizes.from_config and the layouts it relies on (ARENA.md §2, §4).

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
    "BUFFER_NAMES", "BufferSizes", "DecodeMetaLayout", "Target",
    "GATEUP_FUSED_MAX_M", "DECODE_META_MIN_ROWS", "DECODE_META_MAX_ROWS",
    "Q12_SIZING_STREAMS", "VERIFY_ROW_CAP", "SPLITK_POLICIES", "resolve_splitk",
]

GATEUP_FUSED_MAX_M = 16
DECODE_META_MIN_ROWS = 32
DECODE_META_MAX_ROWS = 128
Q12_SIZING_STREAMS = 8
VERIFY_ROW_CAP = 160

_DECODE_META_OFFSET = 32_768   # batched decode / verify metadata inside `scratch`
_SCRATCH_FLOOR = 65_536
_FLOOR = 256
_Q8_SLACK = 1 << 20
_MAX_DECODE_SPLITS = 16
_SPLITK_TARGET_WAVES = 2

# The buffer names in canonical order (ARENA.md §2.2), index i being buffer
# id i of the C core, and which ones total_bytes() counts: from the buffer
# table (src/buffers.h), through the module generated from it.
_TOTALLED = tuple(BUFFER_INDEX[n] for n in GROUPS["total"])


# -- Target and split-K (§4.3) -------------------------------------------------

_PINNED = tuple(str(n) for n in range(1, _MAX_DECODE_SPLITS + 1))
# Every value Target.splitk takes: the two policies, then the pinned counts.
SPLITK_POLICIES = ("legacy", "auto") + _PINNED


class Target(Record):
    """The device an arena is sized for: SM count and split-K policy."""

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
        """The reference build target: 48 SMs, legacy split-K."""
        return cls(48, "legacy")


def resolve_splitk(target, env):
    """The effective policy: ("legacy", 0), ("auto", 0) or ("pinned", n).

    `METRALE_ATTN_DECODE_SPLITK` in `env` overrides `target.splitk`; the launch
    and the workspace use the same resolver so they always agree.
    """
    policy = target.splitk
    raw = env.get("METRALE_ATTN_DECODE_SPLITK")
    if isinstance(raw, str):
        v = raw.strip().lower()
        if v in ("legacy", "auto"):
            policy = v
        elif v in ("0", "off", "false", "no"):
            policy = "1"
        elif v.isascii() and v.isdigit() and int(v) >= 1:
            policy = v
    if policy in ("legacy", "auto"):
        return policy, 0
    return "pinned", int(policy)


def splitk_slots(target, env, num_heads, rows):
    policy, n = resolve_splitk(target, env)
    if policy == "legacy":
        return max(target.sm_count, 1)
    heads = max(num_heads, 1)
    if policy == "auto":
        n = cdiv(_SPLITK_TARGET_WAVES * target.sm_count, heads)
    splits = min(max(n, 1), _MAX_DECODE_SPLITS)
    return max(rows, 1) * heads * splits


# -- DecodeMetaLayout (§4.2) ------------------------------------------------------

class DecodeMetaLayout:
    """Byte layout of the batched-decode metadata upload."""

    __slots__ = ("_rows",)

    def __init__(self, rows):
        self._rows = check_index(rows, "rows")

    @classmethod
    def for_max_batch_size(cls, n):
        n = check_index(n, "max_batch_size")
        return cls(max(n, DECODE_META_MIN_ROWS))

    def rows(self):
        return self._rows

    def positions_offset(self):
        return 0

    def seq_slot_offset(self):
        return 4 * self._rows

    def slots_offset(self):
        return 8 * self._rows

    def seq_lens_offset(self):
        return 16 * self._rows

    def block_table_offset(self):
        # 4R gap after the sequence lengths, as the reference packs it.
        return 24 * self._rows

    def meta_bytes(self, max_blocks):
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


# -- scratch (§4.1) -----------------------------------------------------------------

def _q12(n, c, k, ps):
    t = n * c
    return (ceil_to(8 * t * k, 64) + n * max(16 * c + 64, 4096) + ps * ceil_to(4 * t, 8)
            + ceil_to(8 * t, 8) + 2 * ceil_to(8 * n, 8) + ceil_to(4 * (n + 1), 8)
            + ceil_to(4 * n, 8) + 8 * n)


def scratch_terms(config, M, B, R):
    """(prefill_term, decode_term, q12_term) of §4.1."""
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


# -- BufferSizes (§8.1) ---------------------------------------------------------------

class BufferSizes(Mapping):
    """The byte size of each of the 46 buffers of one forward pass.

    One int attribute per buffer (``sizes.logits``), and a read-only mapping
    of buffer name to bytes in canonical order (``sizes["logits"]``,
    ``dict(sizes)``, ``len(sizes) == 46``).  Immutable; `replace` makes a
    changed copy.  Usually made by `from_config`; ``BufferSizes(**sizes)``
    takes all 46 entries.

    Raises
    ------
    TypeError
        An entry is missing, unknown, or not an int.
    ValueError
        An entry is negative or does not fit 64 bits.
    """

    __slots__ = ("_values", "_levers")

    def __init__(self, **sizes):
        missing = [n for n in BUFFER_NAMES if n not in sizes]
        if missing:
            raise TypeError(f"BufferSizes() missing entries: {', '.join(missing)}")
        self._values = _validated(sizes)
        self._levers = {}

    @classmethod
    def _make(cls, values, levers=None):
        self = object.__new__(cls)
        self._values = values
        self._levers = levers or {}
        return self

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
                    max_batch_size, *, target=None, env=None):
        """Evaluate every formula of ARENA.md §2 and §4."""
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
        M = check_index(max_batch_tokens, "max_batch_tokens", 1)
        max_seq_len = check_index(max_seq_len, "max_seq_len")
        kv_block_size = check_index(kv_block_size, "kv_block_size")
        max_batch_size = check_index(max_batch_size, "max_batch_size")
        values = _compute(config, M, max_seq_len, kv_block_size, max_batch_size, target, env)
        levers = {}
        for lv in LEVERS:
            raw = env.get(lv.name)
            if lv.name == "METRALE_ATTN_DECODE_SPLITK":
                if isinstance(raw, str):
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
        return cls._make(values, levers)

    def total_bytes(self):
        """Sum of the 44 sizes the reference preflight counts: all but o_latent
        and norm_unit_w (§8.1)."""
        v = self._values
        return sum(v[i] for i in _TOTALLED)

    def as_dict(self):
        return dict(zip(BUFFER_NAMES, self._values))

    def as_tuple(self):
        """The 46 sizes in canonical order."""
        return self._values

    def replace(self, **changes):
        values = list(self._values)
        for name, v in changes.items():
            i = BUFFER_INDEX.get(name)
            if i is None:
                raise TypeError(f"BufferSizes has no entry {name!r}")
            values[i] = v
        return BufferSizes._make(_validated(dict(zip(BUFFER_NAMES, values))), self._levers)

    def __eq__(self, other):
        if type(other) is not BufferSizes:
            return NotImplemented
        return self._values == other._values

    def __hash__(self):
        return hash(self._values)

    def __reduce__(self):
        return (BufferSizes._make, (self._values, self._levers))

    def __repr__(self):
        return "BufferSizes(" + ", ".join(f"{n}={v}" for n, v in zip(BUFFER_NAMES, self._values)) + ")"


def _validated(sizes):
    extra = set(sizes) - set(BUFFER_NAMES)
    if extra:
        raise TypeError(f"BufferSizes has no entry {sorted(map(str, extra))[0]!r}")
    return tuple(check_index(sizes[name], f"size of {name}") for name in BUFFER_NAMES)


for _i, _name in enumerate(BUFFER_NAMES):
    setattr(BufferSizes, _name, property(lambda self, _i=_i: self._values[_i],
                                         doc=f"Bytes of {_name}."))
del _i, _name


def _compute(c, M, max_seq_len, kv_block_size, max_batch_size, target, env):
    Mp = ceil_to(M, 16)
    Kx = ceil_to(max(M, 3), 16)
    R = max(DECODE_META_MIN_ROWS, max_batch_size)
    B = 256 if kv_block_size == 0 else max_seq_len // kv_block_size + 1
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
