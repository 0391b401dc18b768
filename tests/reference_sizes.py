"""A second implementation of the reference sizing, for the tests.

The sizes of `REFERENCE` come from the formulas of its specs
(metrale/_sizing/_reference_table.py, evaluated by `BufferSizes.from_config`).  This module
computes them again, written as straight-line Python from the spec's formulas
(shared/spec/ARENA.md), the way the sizing was written before the buffer table
became data: `reference_sizes` must give the same values for every config,
limit, target and lever (tests/test_buffer_set_properties.py,
tests/test_examples.py), one for each reference buffer of the oracle
(tests/reference_oracle.py).
"""

from metrale._base._math import ceil_to, cdiv
from metrale.levers import lever_on
from metrale.sizes import (DECODE_META_MIN_ROWS, GATEUP_FUSED_MAX_M, Q12_SIZING_STREAMS,
                           VERIFY_ROW_CAP, kv_blocks_per_seq, resolve_splitk, sizing_inputs)

from reference_oracle import NAMES

_DECODE_META_OFFSET = 32_768
_SCRATCH_FLOOR = 65_536
_FLOOR = 256
_Q8_SLACK = 1 << 20
_MAX_DECODE_SPLITS = 16
_SPLITK_TARGET_WAVES = 2


def reference_sizes(config, max_batch_tokens, max_seq_len, kv_block_size, max_batch_size,
                    target=None, env=None, tp_size=1):
    """The sizes of the oracle's reference buffers, in canonical order (a
    tuple, one per name of reference_oracle.NAMES)."""
    M, S, kb, bs, target, env = sizing_inputs(config, max_batch_tokens, max_seq_len,
                                              kv_block_size, max_batch_size, target, env)
    return _compute(config.shard(tp_size), M, S, kb, bs, target, env)


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
    s["moe_fp8_scratch"] = moe_fp8_bytes(c, M)
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
    return tuple(s[n] for n in NAMES)


def moe_fp8_bytes(c, rows):
    """The FP8 MoE slab's bytes for `rows` (ARENA.md 4.9), straight-line: the
    regions one after another, each at a multiple of 256 bytes."""
    E, H, Im = c.num_experts, c.hidden_size, c.moe_intermediate_size
    if E == 0:
        return 0
    expanded = rows * c.num_experts_per_tok
    shared_k = max(H, c.shared_expert_intermediate_size)
    act = max(rows * shared_k, expanded * Im)
    scl = 4 * max(rows * cdiv(shared_k, 128), expanded * cdiv(Im, 128))
    width_tiles = cdiv(max(H, Im), 64)
    items = (cdiv(expanded, 128) + E + 1) * width_tiles
    counter = ceil_to(act, 256) + ceil_to(scl, 256) + ceil_to(8 * items, 256)
    small_bytes = E * width_tiles * 8 if E == 256 else 0
    if small_bytes:
        return ceil_to(counter + 4, 256) + ceil_to(small_bytes, 256) + 4
    return counter + 4
