import json
import pathlib

import pytest

from metrale import ModelConfig

DATA = pathlib.Path(__file__).parent / "data" / "hf"


def test_defaults_and_field_count():
    c = ModelConfig()
    d = c.as_dict()
    assert len(d) == 39
    assert c.num_experts_per_tok == 1
    assert c.attn_gated is False and c.mrope_interleaved is False
    assert c.model_type == "" and c.layer_types == () and c.quantization == ""
    assert all(v == 0 for k, v in d.items()
               if k not in ("num_experts_per_tok", "attn_gated", "mrope_interleaved",
                            "model_type", "layer_types", "quantization"))


def test_frozen_hashable_equal():
    a = ModelConfig(hidden_size=8)
    b = ModelConfig(hidden_size=8)
    assert a == b and hash(a) == hash(b)
    assert a != ModelConfig(hidden_size=9)
    with pytest.raises(AttributeError):
        a.hidden_size = 3
    assert a.replace(hidden_size=3).hidden_size == 3 and a.hidden_size == 8


@pytest.mark.parametrize("kw, exc, word", [
    (dict(hidden_size=-1), ValueError, "hidden_size"),
    (dict(hidden_size=1.5), TypeError, "hidden_size"),
    (dict(hidden_size=True), TypeError, "hidden_size"),
    (dict(attn_gated=1), TypeError, "attn_gated"),
    (dict(model_type=3), TypeError, "model_type"),
    (dict(layer_types=[1]), TypeError, "layer_types"),
    (dict(nonsense=1), TypeError, "nonsense"),
])
def test_validation(kw, exc, word):
    with pytest.raises(exc, match=word):
        ModelConfig(**kw)


def test_layer_types_any_iterable():
    c = ModelConfig(layer_types=iter(["linear_attention", "full_attention"]))
    assert c.layer_types == ("linear_attention", "full_attention")
    assert c.num_ssm_layers() == 1


def test_presets_order_and_unknown():
    assert ModelConfig.presets() == ("qwen3-next-80b", "qwen3.8-27b", "glm-5.3-flash-tp2",
                                     "deepseek-v4", "nemotron-h", "gemma-4-dense",
                                     "llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b",
                                     "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3",
                                     "gpt-oss-120b")
    with pytest.raises(ValueError, match="qwen3-next-80b"):
        ModelConfig.preset("nope")


# ARENA.md §3.3, derived rows: QKVZ / Vd, Di / Dx / Dip, num_ssm_layers, moe_input_size.
@pytest.mark.parametrize("name, qkvz, vd, di, dx, dip, ssm, hin", [
    ("qwen3-next-80b", 12288, 4096, 0, 0, 0, 36, 2048),
    ("qwen3.8-27b", 16384, 6144, 0, 0, 0, 48, 5120),
    ("glm-5.3-flash-tp2", 16384, 4096, 0, 0, 0, 36, 4096),
    ("deepseek-v4", 0, 0, 0, 0, 0, 0, 4096),
    ("nemotron-h", 0, 0, 4096, 6144, 10304, 23, 2688),
    ("gemma-4-dense", 0, 0, 0, 0, 0, 0, 5376),
    ("llama-3.1-8b", 0, 0, 0, 0, 0, 0, 4096),
    ("llama-3.1-70b", 0, 0, 0, 0, 0, 0, 8192),
    ("qwen2.5-7b", 0, 0, 0, 0, 0, 0, 3584),
    ("qwen3-30b-a3b", 0, 0, 0, 0, 0, 0, 2048),
    ("mixtral-8x7b", 0, 0, 0, 0, 0, 0, 4096),
    ("deepseek-v3", 0, 0, 0, 0, 0, 0, 7168),
    ("gpt-oss-120b", 0, 0, 0, 0, 0, 0, 2880),     # sliding and full attention: no SSM layer
])
def test_preset_derived(name, qkvz, vd, di, dx, dip, ssm, hin):
    c = ModelConfig.preset(name)
    assert c.ssm_qkvz_size() == qkvz
    assert c.linear_num_value_heads * c.linear_value_head_dim == vd
    assert (c.mamba2_d_inner(), c.mamba2_d_xbc(), c.mamba2_in_proj_size()) == (di, dx, dip)
    assert c.num_ssm_layers() == ssm
    assert c.moe_input_size() == hin


def test_nemotron_pattern():
    c = ModelConfig.preset("nemotron-h")
    assert len(c.layer_types) == 52
    assert c.layer_types.count("linear_attention") == 23
    assert c.layer_types.count("moe") == 23
    assert c.layer_types.count("full_attention") == 6


def test_num_ssm_layers_rules():
    assert ModelConfig(num_hidden_layers=48, full_attention_interval=4).num_ssm_layers() == 36
    assert ModelConfig(num_hidden_layers=48).num_ssm_layers() == 0
    assert ModelConfig(moe_latent_size=7, hidden_size=9).moe_input_size() == 7
    assert ModelConfig(linear_num_value_heads=5).ssm_ba_size() == 10


# -- from_hf_config against the numbers in each file ------------------------------------

def _load(name):
    return json.loads((DATA / name).read_text())


def test_hf_llama_dense_defaults():
    c = ModelConfig.from_hf_config(DATA / "llama-3.1-8b.json")
    raw = _load("llama-3.1-8b.json")
    assert c.model_type == "llama"
    assert (c.hidden_size, c.intermediate_size, c.vocab_size) == \
        (raw["hidden_size"], raw["intermediate_size"], raw["vocab_size"])
    assert c.num_key_value_heads == raw["num_key_value_heads"]
    assert c.head_dim == raw["hidden_size"] // raw["num_attention_heads"]   # default
    assert c.num_experts == 0 and c.attn_gated is False


def test_hf_qwen3_dense_head_dim_given():
    c = ModelConfig.from_hf_config(str(DATA / "qwen3-8b.json"))
    assert c.head_dim == 128 and c.num_attention_heads == 32 and c.num_key_value_heads == 8


def test_hf_qwen3_moe():
    c = ModelConfig.from_hf_config(_load("qwen3-30b-a3b.json"))
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (128, 8, 768)


def test_hf_qwen3_next_matches_preset():
    c = ModelConfig.from_hf_config(DATA / "qwen3-next-80b-a3b.json")
    assert c.attn_gated is True     # default for qwen3_next
    assert c == ModelConfig.preset("qwen3-next-80b")


def test_hf_deepseek_aliases():
    c = ModelConfig.from_hf_config(DATA / "deepseek-v3.json")
    assert c.num_experts == 256          # n_routed_experts
    assert (c.kv_lora_rank, c.q_lora_rank, c.qk_rope_head_dim) == (512, 1536, 64)
    # MLA: the query/key head is qk_nope_head_dim + qk_rope_head_dim = 128 + 64, wider
    # than the value head (v_head_dim 128), not hidden_size / heads = 56
    assert c.head_dim == 192
    assert c.shared_expert_intermediate_size == 1 * 2048   # n_shared_experts * moe width


def test_hf_nemotron_pattern(tmp_path):
    (tmp_path / "config.json").write_text((DATA / "nemotron-h-8b.json").read_text())
    c = ModelConfig.from_hf_config(tmp_path)       # a directory
    pat = _load("nemotron-h-8b.json")["hybrid_override_pattern"]
    assert len(c.layer_types) == len(pat)
    assert c.num_ssm_layers() == pat.count("M")
    assert c.layer_types[1] == "mlp" and c.layer_types[7] == "full_attention"
    assert c.mamba2_d_inner() == 128 * 64


def test_hf_gemma_text_config():
    c = ModelConfig.from_hf_config(DATA / "gemma-3-27b.json")
    t = _load("gemma-3-27b.json")["text_config"]
    assert c.model_type == "gemma3"            # always from the top level
    # the published file gives no vocab_size: Gemma3TextConfig's default, 262,208
    assert "vocab_size" not in t and c.vocab_size == 262208
    assert (c.hidden_size, c.head_dim) == (t["hidden_size"], 128)


def test_hf_nulls_aliases_and_types():
    shape = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100,
             "intermediate_size": 128}
    c = ModelConfig.from_hf_config({**shape, "num_attention_heads": 0, "head_dim": None,
                                    "num_local_experts": 8, "moe_shared_expert_intermediate_size": 5,
                                    "attn_output_gate": True, "unknown": 1})
    assert c.num_attention_heads == 0 and c.head_dim == 0
    assert c.num_experts == 8 and c.shared_expert_intermediate_size == 5 and c.attn_gated
    with pytest.raises(TypeError, match="hidden_size"):
        ModelConfig.from_hf_config({"hidden_size": "4096"})
    with pytest.raises(TypeError, match="path_or_dict"):
        ModelConfig.from_hf_config(3)


SHAPE = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 256}


@pytest.mark.parametrize("missing", sorted(set(SHAPE) - {"model_type"}))
def test_hf_refuses_a_config_without_the_shape(missing):
    data = {k: v for k, v in SHAPE.items() if k != missing}
    with pytest.raises(ValueError, match=f"config dict: the config has no '{missing}'"):
        ModelConfig.from_hf_config(data)
    with pytest.raises(ValueError, match="hidden_size"):
        ModelConfig.from_hf_config({})
    with pytest.raises(ValueError, match=f"no '{missing}'"):
        ModelConfig.from_hf_config({**data, missing: None})      # null counts as absent


# Older families' key names (trimmed from their published config.json files).
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
        "vocab_size": 50257, "n_positions": 1024}
NEOX = {"model_type": "gpt_neox", "hidden_size": 6144, "num_hidden_layers": 44,
        "num_attention_heads": 64, "intermediate_size": 24576, "vocab_size": 50432}
FALCON_7B = {"model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32,
             "num_attention_heads": 71, "multi_query": True, "vocab_size": 65024}
FALCON_40B = {"model_type": "falcon", "hidden_size": 8192, "n_layer": 60, "n_head": 128,
              "new_decoder_architecture": True, "num_kv_heads": 8, "vocab_size": 65024}
BLOOM = {"model_type": "bloom", "n_embed": 1024, "n_layer": 24, "num_attention_heads": 16,
         "vocab_size": 250880}


@pytest.mark.parametrize("data, expect", [
    (GPT2, dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                num_key_value_heads=12, head_dim=64, intermediate_size=3072, vocab_size=50257)),
    ({**GPT2, "n_inner": 1000}, dict(intermediate_size=1000)),
    (NEOX, dict(hidden_size=6144, intermediate_size=24576, num_key_value_heads=64, head_dim=96)),
    (FALCON_7B, dict(num_key_value_heads=1, intermediate_size=4 * 4544, head_dim=64)),
    (FALCON_40B, dict(num_hidden_layers=60, num_attention_heads=128, num_key_value_heads=8,
                      intermediate_size=32768, head_dim=64)),
    (BLOOM, dict(hidden_size=1024, num_hidden_layers=24, intermediate_size=4096, head_dim=64)),
])
def test_hf_family_aliases(data, expect):
    c = ModelConfig.from_hf_config(data)
    for k, v in expect.items():
        assert getattr(c, k) == v, k


def test_hf_file_errors_name_the_file(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    bad = tmp_path / "bad.json"
    bad.write_text('{"hidden_size": 4096,')
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00{")
    array = tmp_path / "array.json"
    array.write_text("[1, 2]")
    huge = tmp_path / "huge.json"
    huge.write_text('{"hidden_size": ' + "9" * 5000 + "}")
    for path, word in ((deep, "nested too deeply"), (bad, "malformed JSON"),
                       (binary, "not UTF-8"), (array, "must hold a JSON object, got list"),
                       (huge, "malformed JSON")):
        with pytest.raises(ValueError, match=word) as e:
            ModelConfig.from_hf_config(path)
        assert str(path) in str(e.value)
    with pytest.raises(ValueError, match="JSON text, not a path"):
        ModelConfig.from_hf_config(json.dumps(SHAPE))
    with pytest.raises(FileNotFoundError):
        ModelConfig.from_hf_config(tmp_path / "absent.json")
    with pytest.raises(TypeError, match="path_or_dict"):
        ModelConfig.from_hf_config(b"config.json")


def test_quantization_config():
    base = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 128}
    ct = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"type": "float", "num_bits": 8, "strategy": "channel"}}}}
    for qc, expect in [
        (None, ""), ({"quant_method": "fbgemm_fp8"}, "fp8-rowwise"), (ct, "fp8-rowwise"),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8"),
        ({"quant_method": "gptq", "bits": 4}, "gptq"),
        (dict(ct, config_groups={"g": {"weights": {"type": "int", "num_bits": 4,
                                                   "strategy": "group"}}}), "compressed-tensors"),
    ]:
        cfg = ModelConfig.from_hf_config(dict(base, quantization_config=qc) if qc else base)
        assert cfg.quantization == expect
    for qc, exc in [([1], TypeError), ({"bits": 4}, ValueError), ({"quant_method": 3}, ValueError)]:
        with pytest.raises(exc, match="quantization_config"):
            ModelConfig.from_hf_config(dict(base, quantization_config=qc))
    with pytest.raises(TypeError, match="quantization"):
        ModelConfig(quantization=1)
