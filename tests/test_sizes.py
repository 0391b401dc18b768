"""Every golden value and worked example of ARENA.md, against BufferSizes."""

import pytest

from metrale import (BufferSizes, DecodeMetaLayout, ModelConfig, Target, DECODE_META_MAX_ROWS,
                     DECODE_META_MIN_ROWS, GATEUP_FUSED_MAX_M, Q12_SIZING_STREAMS, VERIFY_ROW_CAP)
from metrale.sizes import BUFFER_NAMES
from reference_oracle import COUNT, NAMES
from reference_sizes import scratch_terms

PRESET = ModelConfig.preset("qwen3-next-80b")
NOENV = {}


def sizes(cfg=PRESET, m=1, seq=4096, blk=16, bs=32, **kw):
    kw.setdefault("env", NOENV)
    return BufferSizes.from_config(cfg, m, seq, blk, bs, **kw)


def test_constants():
    assert (GATEUP_FUSED_MAX_M, DECODE_META_MIN_ROWS, DECODE_META_MAX_ROWS,
            Q12_SIZING_STREAMS, VERIFY_ROW_CAP) == (16, 32, 128, 8, 160)


def test_names_order_and_dict():
    s = sizes()
    assert tuple(BUFFER_NAMES) == NAMES and len(set(BUFFER_NAMES)) == COUNT
    assert list(s.as_dict()) == list(NAMES)
    assert BUFFER_NAMES[0] == "hidden_states" and BUFFER_NAMES[-1] == "ssm_rowwise_w_bf16"
    assert repr(s).startswith("BufferSizes(hidden_states=4096, residual=4096")


def test_golden_A():
    s = sizes(m=1)
    assert s.hidden_states == 4096
    assert s.qkv_output == 294_912 == 16 * (16 * 2 + 2 * 2) * 256 * 2
    assert s.attn_output == 8192
    assert s.gate_logits == 1024
    assert s.logits == 303_872
    assert s.ssm_qkvz == 393_216 == 16 * 12_288 * 2
    assert s.ssm_ba == 256
    assert s.ssm_deinterleaved == 393_216
    assert s.ssm_gates == 256


def test_golden_B_mixed_dense_moe():
    cfg = PRESET.replace(intermediate_size=12288, num_experts=256, num_experts_per_tok=10,
                         moe_intermediate_size=1024)
    s = sizes(cfg, m=4)
    assert s.expert_gate_out == s.expert_up_out == 16 * 12_288 * 2 == 393_216


def test_golden_C_scaling():
    assert sizes(m=128).hidden_states == 128 * sizes(m=1).hidden_states
    assert sizes(m=128).logits == 128 * 151_936 * 2 == 38_895_616


def test_golden_D_decode_meta_widening():
    base = sizes(m=8192, bs=32)
    for bs in (1, 31, 32):
        s = sizes(m=8192, bs=bs)
        assert (s.total_bytes(), s.scratch, s.logits) == (base.total_bytes(), base.scratch, base.logits)
        assert s.logits == 160 * 151_936 * 2
    for bs in (33, 64, 128, 159):
        assert sizes(m=8192, bs=bs).total_bytes() == base.total_bytes()
    assert sizes(m=8192, bs=160).logits == 161 * 151_936 * 2 == 48_923_392
    s = sizes(m=8192, bs=192)
    assert s.logits == 193 * 151_936 * 2 == 58_647_296
    assert s.scratch >= 32_768 + 24 * 192 + 192 * 257 * 4 == 234_752


def test_golden_E_rowwise_sizing():
    c = ModelConfig.preset("qwen3.8-27b")
    for env in ({}, {"METRALE_FP8_ROWWISE": "0"}, {"METRALE_FP8_ROWWISE": "true"},
                {"METRALE_FP8_ROWWISE": " 1"}, {"METRALE_FP8_ROWWISE": "01"}):
        assert sizes(c, m=64, env=env).ssm_rowwise_w_bf16 == 0
    assert c.ssm_qkvz_size() == 16_384
    per_layer = 167_772_160 + 62_914_560
    assert 2 * 16_384 * 5120 == 167_772_160 and per_layer == 230_686_720
    on = sizes(c, m=64, env={"METRALE_FP8_ROWWISE": "1"})
    assert on.ssm_rowwise_w_bf16 == 48 * per_layer == 11_072_962_560
    s = sizes(c, m=64)
    assert s.replace(ssm_rowwise_w_bf16=4096).total_bytes() - s.total_bytes() == 4096
    compact = PRESET.replace(hidden_size=512, num_hidden_layers=4, linear_num_key_heads=4,
                             linear_key_head_dim=64, linear_num_value_heads=8,
                             linear_value_head_dim=64)
    assert sizes(compact, m=64, env={"METRALE_FP8_ROWWISE": "1"}).ssm_rowwise_w_bf16 == 6_291_456


@pytest.mark.parametrize("n", [0, 1, 31, 32])
def test_golden_F_floor(n):
    d = DecodeMetaLayout.for_max_batch_size(n)
    assert d.rows() == 32
    assert (d.positions_offset(), d.seq_slot_offset(), d.slots_offset(), d.seq_lens_offset(),
            d.block_table_offset()) == (0, 128, 256, 512, 768)
    assert d.meta_bytes(257) == 768 + 32 * 257 * 4 == 33_664


@pytest.mark.parametrize("n, offs, mb", [
    (33, (0, 132, 264, 528, 792), 24 * 33 + 33 * 257 * 4),
    (64, (0, 256, 512, 1024, 1536), 67_328),
    (128, (0, 512, 1024, 2048, 3072), 134_656),
])
def test_golden_F_above_floor(n, offs, mb):
    d = DecodeMetaLayout.for_max_batch_size(n)
    assert d.rows() == n
    got = (d.positions_offset(), d.seq_slot_offset(), d.slots_offset(), d.seq_lens_offset(),
           d.block_table_offset())
    assert got == offs and d.slots_offset() % 8 == 0
    assert d.meta_bytes(257) == mb


def test_decode_meta_value_semantics():
    assert DecodeMetaLayout.for_max_batch_size(1) == DecodeMetaLayout.for_max_batch_size(32)
    assert hash(DecodeMetaLayout.for_max_batch_size(1)) == hash(DecodeMetaLayout.for_max_batch_size(32))
    assert DecodeMetaLayout.for_max_batch_size(64) != DecodeMetaLayout.for_max_batch_size(32)
    assert "64" in repr(DecodeMetaLayout.for_max_batch_size(64))
    with pytest.raises(ValueError, match="max_batch_size"):
        DecodeMetaLayout.for_max_batch_size(-1)


def test_golden_I_q2():
    on = {"METRALE_GGUF_NATIVE_Q2": "1"}
    s = sizes(m=3, env=on)
    for need in (5120 * 2048 * 2, 12_288 * 2048 * 2, 16 * 2 * 256 * 2048 * 2, 2 * 256 * 2048 * 2):
        assert s.q2_dequant_scratch >= need
    assert s.q2_dequant_scratch == 50_331_648
    mmq = 3 * 5120 * 4 + 1_048_576
    assert (sizes(m=3).q2_dequant_scratch, sizes(m=3).q2_act_q8) == (0, 0)
    assert (s.q2_dequant_scratch, s.q2_act_q8) == (50_331_648, 0)
    s = sizes(m=3, env={"METRALE_GGUF_NATIVE_Q2_MMQ": "1"})
    assert (s.q2_dequant_scratch, s.q2_act_q8) == (0, mmq) and mmq == 1_110_016
    s = sizes(m=3, env={"METRALE_GGUF_NATIVE_Q2": "1", "METRALE_GGUF_NATIVE_Q2_MMQ": "1"})
    assert (s.q2_dequant_scratch, s.q2_act_q8) == (50_331_648, 1_110_016)


def test_levers_read_at_call_time(monkeypatch):
    monkeypatch.setenv("METRALE_GGUF_NATIVE_Q2", "1")
    assert BufferSizes.from_config(PRESET, 3, 4096, 16, 32).q2_dequant_scratch == 50_331_648
    monkeypatch.setenv("METRALE_GGUF_NATIVE_Q2", "yes")
    assert BufferSizes.from_config(PRESET, 3, 4096, 16, 32).q2_dequant_scratch == 0


def test_scratch_worked_example():
    assert scratch_terms(PRESET, 1000, 257, 32) == (93_032, 201_088, 125_032)
    assert sizes(m=1000).scratch == 201_088
    mrope = PRESET.replace(mrope_interleaved=True)
    assert scratch_terms(mrope, 1000, 257, 32) == (101_032, 201_088, 133_032)
    assert sizes(mrope, m=1000).scratch == 201_088
    assert sizes(m=1, bs=0, seq=0, blk=0).scratch >= 65_536


@pytest.mark.parametrize("target, env, bs, expect", [
    (Target.reference(), {}, 32, 49_536),
    (Target.reference(), {}, 128, 49_536),
    (Target(132, "auto"), {}, 32, 8_454_144),
    (Target(132, "auto"), {}, 128, 33_816_576),
    (Target(48, "auto"), {}, 32, 3_170_304),
    (Target(48, "4"), {}, 32, 2_113_536),
    (Target.reference(), {"METRALE_ATTN_DECODE_SPLITK": "off"}, 32, 528_384),
    (Target.reference(), {"METRALE_ATTN_DECODE_SPLITK": " AUTO "}, 32, 3_170_304),
    (Target(132, "auto"), {"METRALE_ATTN_DECODE_SPLITK": "legacy"}, 32, 132 * 1032),
    (Target.reference(), {"METRALE_ATTN_DECODE_SPLITK": "99"}, 32, 32 * 16 * 16 * 1032),
    (Target.reference(), {"METRALE_ATTN_DECODE_SPLITK": "bogus"}, 32, 49_536),
    (Target.reference(), {"METRALE_ATTN_DECODE_SPLITK": ""}, 32, 49_536),
    (Target(0, "legacy"), {}, 32, 1032),
])
def test_splitk(target, env, bs, expect):
    assert sizes(m=8, bs=bs, target=target, env=env).splitk_workspace == expect


def test_target_validation():
    assert Target.reference() == Target(48, "legacy")
    assert hash(Target(1, "auto")) == hash(Target(1, "auto"))
    assert Target(3, "16").splitk == "16" and "auto" in repr(Target(3, "auto"))
    for bad in ("0", "17", "01", "Auto", ""):
        with pytest.raises(ValueError, match="splitk"):
            Target(1, bad)
    with pytest.raises(ValueError, match="sm_count"):
        Target(-1, "auto")
    with pytest.raises(TypeError, match="sm_count"):
        Target("48", "auto")


# Independent worked values from §4.5 - §4.8.
def test_hc_lowrank_worked():
    cfg = ModelConfig(hidden_size=4096, hc_mult=4, hc_lowrank=8)
    assert sizes(cfg, m=32).hc_lowrank_scratch == 2_098_176
    assert sizes(cfg, m=4096).hc_lowrank_scratch == 134_266_880
    assert sizes(ModelConfig(hidden_size=4096, hc_mult=4), m=32).hc_lowrank_scratch == 256


def test_qsa_worked():
    cfg = ModelConfig(index_n_heads=64, index_head_dim=128, index_topk=512, index_compress_ratio=4)
    assert sizes(cfg, m=8, seq=65_536).qsa_select_scratch == 236_453_888
    assert sizes(ModelConfig.preset("deepseek-v4"), m=8).qsa_select_scratch == 256


def test_fla_and_ssd_worked():
    assert sizes(m=1000).gdn_fla_scratch == 84_148_224
    assert sizes(ModelConfig.preset("nemotron-h"), m=1000).ssd_scratch == 2_785_280
    assert sizes(m=1000).ssd_scratch == 0


def test_gated_entries_per_kind():
    dense = sizes(ModelConfig.preset("gemma-4-dense"), m=128)
    assert dense.moe_fp8_scratch == 0
    assert dense.gate_logits == dense.gate_logits_f32 == dense.moe_router_in_f32 == 256
    assert dense.ffn_gate_up_fused == 64 * 21504 and dense.ffn_act_a == 128 * 21504
    assert dense.ffn_act_scale == 4 * 128 * (21504 // 32)
    assert dense.ffn_act_q8 == 4 * 128 * 21504 + 2 ** 20
    moe = sizes(m=128)
    assert all(getattr(moe, n) == 0 for n in ("ffn_act_q8", "ffn_act_a", "ffn_act_scale",
                                              "ffn_act_scale_kmajor", "ffn_gate_up_fused"))
    lora = sizes(PRESET.replace(adapter_max_rank=16), m=8)
    assert (lora.lora_xa, lora.lora_delta, lora.lora_hact, lora.lora_seq_slot) == \
        (2 * 8 * 16, 2 * 8 * max(2048, 5120, 2 * 16 * 256), 2 * 8 * 5120, 32)
    assert sizes(PRESET.replace(adapter_max_rank=16, intermediate_size=0), m=8).lora_hact == 0
    # FP8 projection scales use a ceiling: Kp = 2049 -> 17 scales per row.
    odd = sizes(ModelConfig(hidden_size=2049), m=16)
    assert odd.fp8_act_scale == odd.fp8_act_scale_kmajor == 4 * 16 * 17
    assert sizes(ModelConfig(hidden_size=2049), m=16).ffn_act_scale_kmajor == 4 * 16 * 16


def test_total_bytes_leaves_two_out():
    s = sizes(m=128)
    d = s.as_dict()
    assert s.total_bytes() == sum(d.values()) - d["o_latent"] - d["norm_unit_w"]


def test_replace_equality_validation():
    s = sizes(m=8)
    t = s.replace(o_latent=512)
    assert t != s and t.o_latent == 512 and s.o_latent == 256 and t.replace(o_latent=256) == s
    assert hash(t.replace(o_latent=256)) == hash(s)
    with pytest.raises(TypeError, match="bogus"):
        s.replace(bogus=1)
    with pytest.raises(TypeError, match="o_latent"):
        s.replace(o_latent=1.0)
    with pytest.raises(ValueError, match="o_latent"):
        s.replace(o_latent=-1)


@pytest.mark.parametrize("args, exc, word", [
    ((PRESET, 0, 4096, 16, 32), ValueError, "max_batch_tokens"),
    ((PRESET, -1, 4096, 16, 32), ValueError, "max_batch_tokens"),
    ((PRESET, 1.0, 4096, 16, 32), TypeError, "max_batch_tokens"),
    ((PRESET, 1, -1, 16, 32), ValueError, "max_seq_len"),
    ((PRESET, 1, 4096, -1, 32), ValueError, "kv_block_size"),
    ((PRESET, 1, 4096, 16, True), TypeError, "max_batch_size"),
    (("cfg", 1, 4096, 16, 32), TypeError, "config"),
])
def test_argument_errors(args, exc, word):
    with pytest.raises(exc, match=word):
        BufferSizes.from_config(*args)


def test_type_errors_target_env():
    with pytest.raises(TypeError, match="target"):
        BufferSizes.from_config(PRESET, 1, 1, 1, 1, target="x")
    with pytest.raises(TypeError, match="env"):
        BufferSizes.from_config(PRESET, 1, 1, 1, 1, env=[("a", "b")])


def test_overflow_names_buffer_and_m():
    with pytest.raises(ValueError, match=r"hidden_states.*max_batch_tokens"):
        BufferSizes.from_config(PRESET, 2 ** 60, 4096, 16, 32, env=NOENV)
    huge = ModelConfig(vocab_size=2 ** 63)
    with pytest.raises(ValueError, match=r"logits.*max_batch_tokens"):
        BufferSizes.from_config(huge, 4, 4096, 16, 32, env=NOENV)


def test_kv_block_zero_gives_256_blocks():
    _, decode, _ = scratch_terms(PRESET, 8, 256, 32)
    assert sizes(m=8, blk=0).scratch == max(65_536, decode)


def test_mapping_behaviour():
    from collections.abc import Mapping
    s = BufferSizes.from_config(PRESET, 128, 4096, 16, 32, env={})
    assert isinstance(s, Mapping) and len(s) == COUNT and list(s) == list(NAMES)
    assert s["logits"] == s.logits and "logits" in s and "nope" not in s and 1 not in s
    assert dict(s) == s.as_dict() and list(s.values()) == list(s.as_tuple())
    assert s.get("nope", -1) == -1
    import pytest as _pytest
    with _pytest.raises(KeyError):
        s["nope"]
    with _pytest.raises(KeyError):
        s[0]
    assert s == s.replace() and hash(s) == hash(s.replace())


def test_levers_recorded():
    import pickle
    s = BufferSizes.from_config(PRESET, 64, 4096, 16, 32,
                                env={"METRALE_FP8_ROWWISE": "1", "METRALE_GGUF_NATIVE_Q2": "0",
                                     "METRALE_ATTN_DECODE_SPLITK": "auto"})
    assert s.levers() == {"METRALE_FP8_ROWWISE": "1", "METRALE_ATTN_DECODE_SPLITK": "auto"}
    assert s.replace(logits=0).levers() == s.levers()
    assert pickle.loads(pickle.dumps(s)).levers() == s.levers()
    assert BufferSizes.from_config(PRESET, 64, 4096, 16, 32, env={}).levers() == {}
    q = PRESET.replace(quantization="fp8-rowwise")
    on = BufferSizes.from_config(q, 64, 4096, 16, 32, env={})
    assert on.levers() == {"METRALE_FP8_ROWWISE": "quantization_config"}
    assert on.ssm_rowwise_w_bf16 == BufferSizes.from_config(
        PRESET, 64, 4096, 16, 32, env={"METRALE_FP8_ROWWISE": "1"}).ssm_rowwise_w_bf16 > 0
    # a variable present decides alone, whatever the config says
    assert BufferSizes.from_config(q, 64, 4096, 16, 32,
                                   env={"METRALE_FP8_ROWWISE": "0"}).ssm_rowwise_w_bf16 == 0


def test_splitk_values_recorded_only_when_used():
    t = Target.reference()
    for raw, recorded in [("garbage", False), ("", False), ("00", False), (" AUTO ", True),
                          ("off", True), ("7", True), ("9" * 5000, True)]:
        s = BufferSizes.from_config(PRESET, 64, 4096, 16, 32, target=t,
                                    env={"METRALE_ATTN_DECODE_SPLITK": raw})
        assert ("METRALE_ATTN_DECODE_SPLITK" in s.levers()) == recorded, raw
    # thousands of digits pin the most splits the workspace holds (16), no int() error
    huge = BufferSizes.from_config(PRESET, 64, 4096, 16, 32,
                                   env={"METRALE_ATTN_DECODE_SPLITK": "9" * 5000})
    assert huge.splitk_workspace == 4 * (PRESET.head_dim + 2) * 32 * PRESET.num_attention_heads * 16
