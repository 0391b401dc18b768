from typing import Mapping

from metrale.config import ModelConfig

GATEUP_FUSED_MAX_M: int
DECODE_META_MIN_ROWS: int
DECODE_META_MAX_ROWS: int
Q12_SIZING_STREAMS: int
VERIFY_ROW_CAP: int
BUFFER_NAMES: tuple[str, ...]

class Target:
    def __init__(self, sm_count: int, splitk: str) -> None: ...
    @property
    def sm_count(self) -> int: ...
    @property
    def splitk(self) -> str: ...
    @classmethod
    def reference(cls) -> Target: ...

def resolve_splitk(target: Target, env: Mapping[str, str]) -> tuple[str, int]: ...
def splitk_slots(target: Target, env: Mapping[str, str], num_heads: int, rows: int) -> int: ...
def scratch_terms(config: ModelConfig, M: int, B: int, R: int) -> tuple[int, int, int]: ...

class DecodeMetaLayout:
    @classmethod
    def for_max_batch_size(cls, n: int) -> DecodeMetaLayout: ...
    def rows(self) -> int: ...
    def positions_offset(self) -> int: ...
    def seq_slot_offset(self) -> int: ...
    def slots_offset(self) -> int: ...
    def seq_lens_offset(self) -> int: ...
    def block_table_offset(self) -> int: ...
    def meta_bytes(self, max_blocks: int) -> int: ...

class MoeFp8Layout:
    scale: int
    worklist: int
    counter: int
    small_worklist: int
    small_bytes: int
    small_counter: int
    bytes: int

def moe_fp8_layout(config: ModelConfig, rows: int) -> MoeFp8Layout: ...

class BufferSizes:
    hidden_states: int
    residual: int
    norm_output: int
    qkv_output: int
    attn_output: int
    gate_logits: int
    gate_logits_f32: int
    moe_router_in_f32: int
    moe_output: int
    logits: int
    ssm_qkvz: int
    ssm_ba: int
    ssm_deinterleaved: int
    ssm_gates: int
    ssm_conv_out_f32: int
    scratch: int
    expert_gate_out: int
    expert_up_out: int
    expert_down_out: int
    splitk_workspace: int
    o_latent: int
    norm_unit_w: int
    hc_streams: int
    hc_post: int
    hc_comb: int
    hc_lowrank_scratch: int
    qsa_select_scratch: int
    ssd_scratch: int
    gdn_fla_scratch: int
    token_ids: int
    ffn_act_q8: int
    ffn_act_a: int
    ffn_act_scale: int
    ffn_act_scale_kmajor: int
    ffn_gate_up_fused: int
    fp8_act: int
    moe_fp8_scratch: int
    fp8_act_scale: int
    fp8_act_scale_kmajor: int
    q2_dequant_scratch: int
    lora_xa: int
    lora_delta: int
    lora_hact: int
    lora_seq_slot: int
    q2_act_q8: int
    ssm_rowwise_w_bf16: int
    def __init__(self, **sizes: int) -> None: ...
    @classmethod
    def from_config(cls, config: ModelConfig, max_batch_tokens: int, max_seq_len: int,
                    kv_block_size: int, max_batch_size: int, *, target: Target | None = ...,
                    env: Mapping[str, str] | None = ...) -> BufferSizes: ...
    def total_bytes(self) -> int: ...
    def as_dict(self) -> dict[str, int]: ...
    def as_tuple(self) -> tuple[int, ...]: ...
    def replace(self, **changes: int) -> BufferSizes: ...
