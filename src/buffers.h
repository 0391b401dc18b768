/* The buffer table: the one place that names the 46 buffers of a forward
 * pass, in canonical order (the order of BufferSizes and of the reference
 * engine's allocations; docs/buffers.md describes each).
 *
 * X(ID, name, flags): ID gives the C id MT_<ID>, name the Python name, flags
 * the helpers that cover the buffer and the accessors the arena gives it.  The
 * enum, the C name and flag arrays and the group counts (arena_core.h), the
 * Python names and groups and the arena's accessors (tools/gen_buffers.py
 * reads this file at build time) are all derived from it: adding a buffer is
 * one line here plus its size formula in sizes.py. */
#ifndef METRALE_BUFFERS_H
#define METRALE_BUFFERS_H

enum {
    MT_IN_ZERO_ALL = 1 << 0,   /* zeroed whole by zero_all */
    MT_IN_ROWS     = 1 << 1,   /* trimmed to the live rows by zero_all_rows */
    MT_IN_PREFILL  = 1 << 2,   /* zeroed by zero_prefill_essentials */
    MT_IN_CHECKSUM = 1 << 3,   /* probed by debug_buffer_checksum */
    MT_IN_TOTAL    = 1 << 4,   /* counted by BufferSizes.total_bytes() */
    MT_HAS_POINTER = 1 << 5,   /* pointer accessor arena.<name>() */
    MT_HAS_BYTES   = 1 << 6,   /* byte accessor arena.<name>_bytes() */
    MT_IN_STEP     = 1 << 7    /* filled from the host every step (StepInputs): placed first */
};

/* Shorthands for the table rows below. */
#define MT_ZWC_T  (MT_IN_ZERO_ALL | MT_IN_ROWS | MT_IN_CHECKSUM | MT_IN_TOTAL)
#define MT_ZWPC_T (MT_ZWC_T | MT_IN_PREFILL)
#define MT_PB     (MT_HAS_POINTER | MT_HAS_BYTES)

#define MT_BUFFER_TABLE(X) \
    X(HIDDEN_STATES,         hidden_states,         MT_ZWPC_T | MT_HAS_POINTER) \
    X(RESIDUAL,              residual,              MT_ZWPC_T | MT_HAS_POINTER) \
    X(NORM_OUTPUT,           norm_output,           MT_ZWC_T | MT_PB) \
    X(QKV_OUTPUT,            qkv_output,            MT_ZWC_T | MT_PB) \
    X(ATTN_OUTPUT,           attn_output,           MT_ZWC_T | MT_PB) \
    X(GATE_LOGITS,           gate_logits,           MT_ZWPC_T | MT_PB) \
    X(GATE_LOGITS_F32,       gate_logits_f32,       MT_IN_TOTAL | MT_HAS_POINTER) \
    X(MOE_ROUTER_IN_F32,     moe_router_in_f32,     MT_IN_TOTAL | MT_HAS_POINTER) \
    X(MOE_OUTPUT,            moe_output,            MT_ZWPC_T | MT_PB) \
    X(LOGITS,                logits,                MT_IN_ZERO_ALL | MT_IN_TOTAL | MT_PB) \
    X(SSM_QKVZ,              ssm_qkvz,              MT_ZWC_T | MT_PB) \
    X(SSM_BA,                ssm_ba,                MT_ZWC_T | MT_HAS_POINTER) \
    X(SSM_DEINTERLEAVED,     ssm_deinterleaved,     MT_ZWC_T | MT_PB) \
    X(SSM_GATES,             ssm_gates,             MT_ZWC_T | MT_HAS_POINTER) \
    X(SSM_CONV_OUT_F32,      ssm_conv_out_f32,      MT_ZWC_T | MT_HAS_POINTER) \
    X(SCRATCH,               scratch,               MT_IN_ZERO_ALL | MT_IN_TOTAL | MT_IN_STEP | MT_PB) \
    X(EXPERT_GATE_OUT,       expert_gate_out,       MT_ZWPC_T | MT_PB) \
    X(EXPERT_UP_OUT,         expert_up_out,         MT_ZWPC_T | MT_HAS_POINTER) \
    X(EXPERT_DOWN_OUT,       expert_down_out,       MT_ZWPC_T | MT_PB) \
    X(SPLITK_WORKSPACE,      splitk_workspace,      MT_IN_ZERO_ALL | MT_IN_CHECKSUM | MT_IN_TOTAL | MT_HAS_POINTER) \
    X(O_LATENT,              o_latent,              MT_HAS_POINTER) \
    X(NORM_UNIT_W,           norm_unit_w,           MT_HAS_POINTER) \
    X(HC_STREAMS,            hc_streams,            MT_IN_TOTAL | MT_HAS_POINTER) \
    X(HC_POST,               hc_post,               MT_IN_TOTAL | MT_HAS_POINTER) \
    X(HC_COMB,               hc_comb,               MT_IN_TOTAL | MT_HAS_POINTER) \
    X(HC_LOWRANK_SCRATCH,    hc_lowrank_scratch,    MT_IN_TOTAL | MT_HAS_POINTER) \
    X(QSA_SELECT_SCRATCH,    qsa_select_scratch,    MT_IN_TOTAL | MT_HAS_POINTER) \
    X(SSD_SCRATCH,           ssd_scratch,           MT_IN_TOTAL | MT_HAS_POINTER) \
    X(GDN_FLA_SCRATCH,       gdn_fla_scratch,       MT_IN_TOTAL | MT_HAS_POINTER) \
    X(TOKEN_IDS,             token_ids,             MT_IN_TOTAL | MT_IN_STEP | MT_HAS_POINTER) \
    X(FFN_ACT_Q8,            ffn_act_q8,            MT_IN_TOTAL | MT_HAS_POINTER) \
    X(FFN_ACT_A,             ffn_act_a,             MT_IN_TOTAL | MT_PB) \
    X(FFN_ACT_SCALE,         ffn_act_scale,         MT_IN_TOTAL | MT_PB) \
    X(FFN_ACT_SCALE_KMAJOR,  ffn_act_scale_kmajor,  MT_IN_TOTAL | MT_PB) \
    X(FFN_GATE_UP_FUSED,     ffn_gate_up_fused,     MT_IN_TOTAL | MT_PB) \
    X(FP8_ACT,               fp8_act,               MT_IN_TOTAL | MT_PB) \
    X(MOE_FP8_SCRATCH,       moe_fp8_scratch,       MT_IN_TOTAL) \
    X(FP8_ACT_SCALE,         fp8_act_scale,         MT_IN_TOTAL | MT_PB) \
    X(FP8_ACT_SCALE_KMAJOR,  fp8_act_scale_kmajor,  MT_IN_TOTAL | MT_PB) \
    X(Q2_DEQUANT_SCRATCH,    q2_dequant_scratch,    MT_IN_TOTAL | MT_PB) \
    X(LORA_XA,               lora_xa,               MT_IN_TOTAL | MT_PB) \
    X(LORA_DELTA,            lora_delta,            MT_IN_TOTAL | MT_PB) \
    X(LORA_HACT,             lora_hact,             MT_IN_TOTAL | MT_PB) \
    X(LORA_SEQ_SLOT,         lora_seq_slot,         MT_IN_TOTAL | MT_HAS_POINTER) \
    X(Q2_ACT_Q8,             q2_act_q8,             MT_IN_TOTAL | MT_PB) \
    X(SSM_ROWWISE_W_BF16,    ssm_rowwise_w_bf16,    MT_IN_TOTAL | MT_HAS_BYTES)

#endif
