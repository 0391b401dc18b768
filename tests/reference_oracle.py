"""The tests' oracle of the reference buffer set, written once, by hand.

The 46 reference buffers of shared/spec/ARENA.md (§2.1, §8.5) in canonical
order, which helper and accessor covers each, and the counts and golden
values the tests expect.  Everything here is written out from the spec, not
read from `metrale.reference.REFERENCE`: tests/test_buffers.py checks the
table against it, and every other test reads its expectations from here.

Tests that check a mechanism (zeroing, placement, poisoning, sentinels) walk
the buffers listed here, so a reference buffer the table has and this module
lacks fails the checks of tests/test_buffers.py, not those of every test.
Adding a reference buffer (docs/buffer-sets.md) is its record in
src/metrale/_sizing/_reference_table.py, its name and groups here, and its formula in
tests/reference_sizes.py.
"""

# -- the buffers, in canonical order ----------------------------------------------------------

NAMES = (
    "hidden_states", "residual", "norm_output", "qkv_output", "attn_output",
    "gate_logits", "gate_logits_f32", "moe_router_in_f32", "moe_output", "logits",
    "ssm_qkvz", "ssm_ba", "ssm_deinterleaved", "ssm_gates", "ssm_conv_out_f32",
    "scratch", "expert_gate_out", "expert_up_out", "expert_down_out", "splitk_workspace",
    "o_latent", "norm_unit_w", "hc_streams", "hc_post", "hc_comb",
    "hc_lowrank_scratch", "qsa_select_scratch", "ssd_scratch", "gdn_fla_scratch", "token_ids",
    "ffn_act_q8", "ffn_act_a", "ffn_act_scale", "ffn_act_scale_kmajor", "ffn_gate_up_fused",
    "fp8_act", "moe_fp8_scratch", "fp8_act_scale", "fp8_act_scale_kmajor", "q2_dequant_scratch",
    "lora_xa", "lora_delta", "lora_hact", "lora_seq_slot", "q2_act_q8",
    "ssm_rowwise_w_bf16",
)
COUNT = 46

# -- the helper groups (ARENA.md §2.1), each in canonical order ---------------------------------

# zero_all (Z): cleared whole by zero_all, by rows or whole by zero_all_rows.
ZERO_ALL = ("hidden_states", "residual", "norm_output", "qkv_output", "attn_output",
            "gate_logits", "moe_output", "logits", "ssm_qkvz", "ssm_ba", "ssm_deinterleaved",
            "ssm_gates", "ssm_conv_out_f32", "scratch", "expert_gate_out", "expert_up_out",
            "expert_down_out", "splitk_workspace")
# zero_prefill_essentials (P).
PREFILL = ("hidden_states", "residual", "gate_logits", "moe_output", "expert_gate_out",
           "expert_up_out", "expert_down_out")
# Row-trimmed by zero_all_rows (W): token-major, each with its rows (docs/buffers.md).
ROWS = ("hidden_states", "residual", "norm_output", "qkv_output", "attn_output",
        "gate_logits", "moe_output", "ssm_qkvz", "ssm_ba", "ssm_deinterleaved", "ssm_gates",
        "ssm_conv_out_f32", "expert_gate_out", "expert_up_out", "expert_down_out")
# Their row rules: rows of max_batch_tokens, except the GEMM-tiled buffers (rows of
# ceil16(max_batch_tokens)) and the two SSM scratches whose size is the larger of a
# layout in either (both; ARENA.md §2.1 rows 11 and 13).
ROW_RULES = dict.fromkeys(ROWS, "M") | {
    "qkv_output": "Mp", "moe_output": "Mp", "expert_gate_out": "Mp", "expert_up_out": "Mp",
    "expert_down_out": "Mp", "ssm_qkvz": "M|Mp", "ssm_deinterleaved": "M|Mp"}
# debug_buffer_checksum (C).
CHECKSUM = ("hidden_states", "residual", "norm_output", "qkv_output", "attn_output",
            "gate_logits", "moe_output", "ssm_qkvz", "ssm_ba", "ssm_deinterleaved", "ssm_gates",
            "ssm_conv_out_f32", "expert_gate_out", "expert_up_out", "expert_down_out",
            "splitk_workspace")
# Left out of total_bytes() (T is every other buffer).
NOT_IN_TOTAL = ("o_latent", "norm_unit_w")
# The step inputs StepInputs uploads into (token ids, then the metadata).
STEP = ("scratch", "token_ids")
# Zero-filled once, at construction.
INIT_ZERO = ("norm_unit_w",)

# -- the compiled accessors (ARENA.md §8.5) ------------------------------------------------------

# No pointer accessor: moe_fp8_scratch(config, rows) gives its regions, and
# ssm_rowwise_w_bf16 is carved by take_ssm_rowwise_w_bf16(bytes).
NO_POINTER = ("moe_fp8_scratch", "ssm_rowwise_w_bf16")
POINTER = tuple(n for n in NAMES if n not in NO_POINTER)
# A <name>_bytes() accessor.
BYTES = ("norm_output", "qkv_output", "attn_output", "gate_logits", "moe_output", "logits",
         "ssm_qkvz", "ssm_deinterleaved", "scratch", "expert_gate_out", "expert_down_out",
         "ffn_act_a", "ffn_act_scale", "ffn_act_scale_kmajor", "ffn_gate_up_fused", "fp8_act",
         "fp8_act_scale", "fp8_act_scale_kmajor", "q2_dequant_scratch", "lora_xa", "lora_delta",
         "lora_hact", "q2_act_q8", "ssm_rowwise_w_bf16")

# Every group by the name BufferSet.groups gives it.
GROUPS = {"zero_all": ZERO_ALL, "rows": ROWS, "prefill": PREFILL, "checksum": CHECKSUM,
          "total": tuple(n for n in NAMES if n not in NOT_IN_TOTAL), "pointer": POINTER,
          "bytes": BYTES, "step": STEP, "init_zero": INIT_ZERO,
          # the reference engine rebuilds nothing on wake: every buffer wakes zeroed
          # (BufferSpec's default contract), none kept, offloaded, filled or undefined
          "wake_keep": (), "wake_offload": (), "wake_fill": (), "wake_undefined": ()}

# -- counts: ARENA.md §2.1 "18 Z, 15 W, 7 P, 16 C, 44 T; 44 pointer and 24 byte accessors" --------

GROUP_COUNTS = {"zero_all": 18, "rows": 15, "prefill": 7, "checksum": 16, "total": 44,
                "pointer": 44, "bytes": 24, "step": 2, "init_zero": 1, "wake_keep": 0,
                "wake_offload": 0, "wake_fill": 0, "wake_undefined": 0}

# -- golden values ---------------------------------------------------------------------------

FIRST, LAST = "hidden_states", "ssm_rowwise_w_bf16"
# Live (non-empty) reference buffers of qwen3-next-80b at max_batch_tokens 128,
# max_seq_len 4096, kv_block_size 16, max_batch_size 32 on the reference target.
LIVE_QWEN3_NEXT_M128 = 33
# The bytes of the row-trimmed buffers (ROWS) of qwen3-next-80b at those limits,
# whole and as zero_all_rows(tokens=1) clears them, and the same at
# max_batch_tokens 1000.  One row of each is 204,160 bytes (ARENA.md §5.2's worked
# example); the GEMM-tiled and both-rule buffers (qkv_output 18,432 a row,
# moe_output 4,096, ssm_qkvz and ssm_deinterleaved 24,576 each, expert_gate_out and
# expert_up_out 10,240 each, expert_down_out 40,960: 133,120) clear ceil16(1) = 16
# rows, so 204,160 + 15 * 133,120.  ARENA.md §5.2 cleared 1 row of them when M is a
# multiple of 16 (its divisibility guess); their rows are now named, and always 16.
ROWS_BYTES_QWEN3_NEXT_M128 = (26_132_480, 204_160 + 15 * 133_120)
ROWS_BYTES_QWEN3_NEXT_M1000 = (205_224_960, 2_200_960)
