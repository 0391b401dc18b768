"""ModelConfig.from_hf_config over the published config.json of every family it
knows (tests/data/hf, sources in tests/data/README.md): the fields each file
gives, written out by hand from the file; the presets equal to their files;
the buffer sizes of every file against the catalogue's second implementation
of the formulas, and the Mixtral and DeepSeek-V3 figures by hand; and the
warnings and refusals for what is not understood."""

import json
import pathlib
import pickle
import warnings

import pytest

from metrale import BufferSizes, ConfigWarning, ModelConfig
from metrale.catalogue import evaluate, symbols
from metrale.sizes import BUFFER_NAMES

DATA = pathlib.Path(__file__).parent / "data" / "hf"
FILES = sorted(p.name for p in DATA.glob("*.json"))

# The fields each published file gives, read off the file by hand: the
# direct keys, and where a rule applies, the rule worked out (commented).
EXPECTED = {
    "llama-2-7b.json": dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=11008,
                            vocab_size=32000, num_attention_heads=32, num_key_value_heads=32,
                            head_dim=128),                                # 4096 / 32
    "llama-3-8b.json": dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
                            vocab_size=128256, num_attention_heads=32, num_key_value_heads=8,
                            head_dim=128),
    "llama-3.1-8b.json": dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
                              vocab_size=128256, num_attention_heads=32, num_key_value_heads=8,
                              head_dim=128),
    "llama-3.1-70b.json": dict(hidden_size=8192, num_hidden_layers=80, intermediate_size=28672,
                               vocab_size=128256, num_attention_heads=64, num_key_value_heads=8,
                               head_dim=128),
    "llama-3.2-3b.json": dict(hidden_size=3072, num_hidden_layers=28, intermediate_size=8192,
                              vocab_size=128256, num_attention_heads=24, num_key_value_heads=8,
                              head_dim=128),
    "llama-3.3-70b.json": dict(hidden_size=8192, num_hidden_layers=80, intermediate_size=28672,
                               vocab_size=128256, num_attention_heads=64, num_key_value_heads=8,
                               head_dim=128),
    "mistral-7b-v0.3.json": dict(hidden_size=4096, num_hidden_layers=32,
                                 intermediate_size=14336, vocab_size=32768,
                                 num_attention_heads=32, num_key_value_heads=8, head_dim=128),
    # Mixtral: every expert is intermediate_size wide
    "mixtral-8x7b.json": dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
                              vocab_size=32000, num_attention_heads=32, num_key_value_heads=8,
                              head_dim=128, num_experts=8, num_experts_per_tok=2,
                              moe_intermediate_size=14336),
    "mixtral-8x22b.json": dict(hidden_size=6144, num_hidden_layers=56, intermediate_size=16384,
                               vocab_size=32000, num_attention_heads=48, num_key_value_heads=8,
                               head_dim=128, num_experts=8, num_experts_per_tok=2,
                               moe_intermediate_size=16384),
    "qwen2.5-7b.json": dict(hidden_size=3584, num_hidden_layers=28, intermediate_size=18944,
                            vocab_size=152064, num_attention_heads=28, num_key_value_heads=4,
                            head_dim=128),
    # rope_scaling.mrope_section: three position streams
    "qwen2.5-vl-7b.json": dict(hidden_size=3584, num_hidden_layers=28, intermediate_size=18944,
                               vocab_size=152064, num_attention_heads=28, num_key_value_heads=4,
                               head_dim=128, mrope_interleaved=True),
    "qwen1.5-moe-a2.7b.json": dict(hidden_size=2048, num_hidden_layers=24,
                                   intermediate_size=5632, vocab_size=151936,
                                   num_attention_heads=16, num_key_value_heads=16, head_dim=128,
                                   num_experts=60, num_experts_per_tok=4,
                                   moe_intermediate_size=1408,
                                   shared_expert_intermediate_size=5632),
    "qwen3-8b.json": dict(hidden_size=4096, num_hidden_layers=36, intermediate_size=12288,
                          vocab_size=151936, num_attention_heads=32, num_key_value_heads=8,
                          head_dim=128),
    "qwen3-30b-a3b.json": dict(hidden_size=2048, num_hidden_layers=48, intermediate_size=6144,
                               vocab_size=151936, num_attention_heads=32, num_key_value_heads=4,
                               head_dim=128, num_experts=128, num_experts_per_tok=8,
                               moe_intermediate_size=768),
    "qwen3-next-80b-a3b.json": dict(
        hidden_size=2048, num_hidden_layers=48, intermediate_size=5120, vocab_size=151936,
        num_attention_heads=16, num_key_value_heads=2, head_dim=256, attn_gated=True,
        full_attention_interval=4, linear_num_key_heads=16, linear_key_head_dim=128,
        linear_num_value_heads=32, linear_value_head_dim=128, num_experts=512,
        num_experts_per_tok=10, moe_intermediate_size=512, shared_expert_intermediate_size=512),
    # MLA: head_dim = max(128 + 64, 128); shared = n_shared_experts * moe width
    "deepseek-v2.json": dict(hidden_size=5120, num_hidden_layers=60, intermediate_size=12288,
                             vocab_size=102400, num_attention_heads=128,
                             num_key_value_heads=128, head_dim=192, num_experts=160,
                             num_experts_per_tok=6, moe_intermediate_size=1536,
                             shared_expert_intermediate_size=2 * 1536, kv_lora_rank=512,
                             q_lora_rank=1536, qk_rope_head_dim=64),
    "deepseek-v2-lite.json": dict(hidden_size=2048, num_hidden_layers=27,
                                  intermediate_size=10944, vocab_size=102400,
                                  num_attention_heads=16, num_key_value_heads=16, head_dim=192,
                                  num_experts=64, num_experts_per_tok=6,
                                  moe_intermediate_size=1408,
                                  shared_expert_intermediate_size=2 * 1408, kv_lora_rank=512,
                                  q_lora_rank=0, qk_rope_head_dim=64),   # no q compression
    "deepseek-v3.json": dict(hidden_size=7168, num_hidden_layers=61, intermediate_size=18432,
                             vocab_size=129280, num_attention_heads=128,
                             num_key_value_heads=128, head_dim=192, num_experts=256,
                             num_experts_per_tok=8, moe_intermediate_size=2048,
                             shared_expert_intermediate_size=2048, kv_lora_rank=512,
                             q_lora_rank=1536, qk_rope_head_dim=64, quantization="fp8"),
    # head_dim given, not hidden / heads (3584 / 16 = 224)
    "gemma-2-9b.json": dict(hidden_size=3584, num_hidden_layers=42, intermediate_size=14336,
                            vocab_size=256000, num_attention_heads=16, num_key_value_heads=8,
                            head_dim=256),
    # text_config; vocab_size absent: Gemma3TextConfig's default 262,208
    "gemma-3-27b.json": dict(hidden_size=5376, num_hidden_layers=62, intermediate_size=21504,
                             vocab_size=262208, num_attention_heads=32, num_key_value_heads=16,
                             head_dim=128),
    "phi-3-mini-4k.json": dict(hidden_size=3072, num_hidden_layers=32, intermediate_size=8192,
                               vocab_size=32064, num_attention_heads=32, num_key_value_heads=32,
                               head_dim=96),                               # 3072 / 32
    "phi-4.json": dict(hidden_size=5120, num_hidden_layers=40, intermediate_size=17920,
                       vocab_size=100352, num_attention_heads=40, num_key_value_heads=10,
                       head_dim=128),
    "gpt-oss-120b.json": dict(hidden_size=2880, num_hidden_layers=36, intermediate_size=2880,
                              vocab_size=201088, num_attention_heads=64, num_key_value_heads=8,
                              head_dim=64, num_experts=128, num_experts_per_tok=4,
                              moe_intermediate_size=2880,
                              layer_types=("sliding_attention", "full_attention") * 18,
                              quantization="mxfp4"),
    "nemotron-h-8b.json": dict(hidden_size=4096, num_hidden_layers=52, intermediate_size=21504,
                               vocab_size=131072, num_attention_heads=32, num_key_value_heads=8,
                               head_dim=128, mamba_num_heads=128, mamba_head_dim=64,
                               ssm_state_size=128, n_groups=8),
    # ChatGLM's names: num_layers, ffn_hidden_size, kv_channels, padded_vocab_size,
    # multi_query_group_num (with multi_query_attention)
    "chatglm3-6b.json": dict(hidden_size=4096, num_hidden_layers=28, intermediate_size=13696,
                             vocab_size=65024, num_attention_heads=32, num_key_value_heads=2,
                             head_dim=128),
    # head_dim given: 5120 / 96 is not a head width
    "glm-4.7.json": dict(hidden_size=5120, num_hidden_layers=92, intermediate_size=12288,
                         vocab_size=151552, num_attention_heads=96, num_key_value_heads=8,
                         head_dim=128, num_experts=160, num_experts_per_tok=8,
                         moe_intermediate_size=1536, shared_expert_intermediate_size=1536),
    # MLA: max(192 + 64, 256), not its head_dim key (64, the rope width)
    "glm-4.7-flash.json": dict(hidden_size=2048, num_hidden_layers=47, intermediate_size=10240,
                               vocab_size=154880, num_attention_heads=20,
                               num_key_value_heads=20, head_dim=256, num_experts=64,
                               num_experts_per_tok=4, moe_intermediate_size=1536,
                               shared_expert_intermediate_size=1536, kv_lora_rank=512,
                               q_lora_rank=768, qk_rope_head_dim=64),
}

# Each new preset and the file it was read from.
PRESET_FILES = {
    "llama-3.1-8b": "llama-3.1-8b.json", "llama-3.1-70b": "llama-3.1-70b.json",
    "qwen2.5-7b": "qwen2.5-7b.json", "qwen3-30b-a3b": "qwen3-30b-a3b.json",
    "mixtral-8x7b": "mixtral-8x7b.json", "deepseek-v3": "deepseek-v3.json",
    "gpt-oss-120b": "gpt-oss-120b.json", "qwen3-next-80b": "qwen3-next-80b-a3b.json",
}


def read(name, **kw):
    """from_hf_config of a data file; any ConfigWarning fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        return ModelConfig.from_hf_config(DATA / name, **kw)


def test_every_data_file_is_checked():
    assert set(FILES) == set(EXPECTED)


@pytest.mark.parametrize("name", FILES)
def test_published_file_fields(name):
    raw = json.loads((DATA / name).read_text())
    want = ModelConfig(model_type=raw["model_type"], **EXPECTED[name])
    got = read(name)
    if name == "nemotron-h-8b.json":          # the pattern, checked below
        got = got.replace(layer_types=())
    assert got == want
    assert read(name, strict=True) == read(name)   # nothing left not understood


def test_nemotron_h_layers():
    c = read("nemotron-h-8b.json")
    pattern = json.loads((DATA / "nemotron-h-8b.json").read_text())["hybrid_override_pattern"]
    assert c.num_ssm_layers() == pattern.count("M") == 24
    assert c.layer_types.count("full_attention") == pattern.count("*") == 4
    # transformers' newer spelling of the same layers, and the older groups key
    raw = json.loads((DATA / "nemotron-h-8b.json").read_text())
    blocks = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    del raw["hybrid_override_pattern"]
    raw["layers_block_type"] = [blocks[ch] for ch in pattern]
    raw["mamba_n_groups"] = raw.pop("n_groups")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        assert ModelConfig.from_hf_config(raw) == c


@pytest.mark.parametrize("preset, name", sorted(PRESET_FILES.items()))
def test_presets_equal_their_files(preset, name):
    assert ModelConfig.preset(preset) == read(name)


# -- sizes: the catalogue's formulas, and the figures by hand ----------------

LIMITS = [(1, 4096, 16, 32), (17, 4096, 16, 32), (8192, 4096, 16, 32), (300, 32768, 64, 160)]


@pytest.mark.parametrize("name", FILES)
def test_sizes_of_published_files(name):
    cfg = read(name)
    bad = []
    for limits in LIMITS:
        got = BufferSizes.from_config(cfg, *limits, env={})
        values = symbols(cfg, *limits, env={})
        for buf in BUFFER_NAMES:
            if evaluate(buf, values) != got[buf]:
                bad.append(f"{buf} at {limits}: formula {evaluate(buf, values):,}, "
                           f"from_config {got[buf]:,}")
    assert not bad, "\n".join(bad)


def test_mixtral_expert_width_by_hand():
    s = BufferSizes.from_config(read("mixtral-8x7b.json"), 8192, 4096, 16, 32, env={})
    # Kx = 8192 rows of BF16, k * I = 2 * 14,336 wide (was max(2 * 0, I): 234,881,024)
    assert s.expert_gate_out == s.expert_up_out == 2 * 8192 * 2 * 14336 == 469_762_048
    assert s.expert_down_out == 2 * 8192 * 2 * 4096 == 134_217_728
    assert s.gate_logits == 2 * 8192 * 8


def test_deepseek_v3_by_hand():
    s = BufferSizes.from_config(read("deepseek-v3.json"), 8192, 4096, 16, 32, env={})
    M, Hq, Hkv, D, KVr, r, Qr = 8192, 128, 128, 192, 512, 64, 1536
    assert s.qkv_output == 2 * M * (Hq + 2 * Hkv) * D == 1_207_959_552
    assert s.attn_output == 2 * M * max(Hq * D, Hq * (KVr + r)) == 1_207_959_552
    assert s.ssm_qkvz == max(2 * (M + M) * Hkv * D, 2 * M * 2048) == 805_306_368
    assert s.ssm_deinterleaved == max(2 * M * Hq * D, 2 * M * Hq * (KVr + r)) == 1_207_959_552
    assert s.ssm_ba == 2 * M * max(r, Qr) == 25_165_824
    assert s.ssm_conv_out_f32 == 2 * M * Hq * r == 134_217_728
    # split-K: 48 slots (the reference target) of D + 2 = 194 float32 (56 + 2 before)
    assert s.splitk_workspace == 4 * (192 + 2) * 48 == 37_248
    # the dense layers (first_k_dense_replace) are wider than k experts: max(8 * 2048, 18432)
    assert s.expert_gate_out == 2 * M * 18432 == 301_989_888
    assert s.expert_down_out == 2 * M * 8 * 7168 == 939_524_096
    assert s.logits == 2 * 160 * 129280 == 41_369_600


def test_shared_expert_width_reaches_the_sizes():
    # n_shared_experts * moe_intermediate_size is the shared MLP's width Is; the
    # formulas read it in ssm_qkvz (2 * M * Is) and the FP8 MoE scratch.
    c = read("deepseek-v2-lite.json")
    assert c.shared_expert_intermediate_size == 2816
    one = c.replace(num_attention_heads=1, num_key_value_heads=1)    # let Is dominate
    s = BufferSizes.from_config(one, 64, 4096, 16, 32, env={})
    assert s.ssm_qkvz == 2 * 64 * 2816


# -- what is not understood: warned about, or refused with strict ---------------------

BASE = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 128, "intermediate_size": 256}


def _notes(data, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = ModelConfig.from_hf_config(data, **kw)
    return cfg, [w.message for w in caught if issubclass(w.category, ConfigWarning)]


def test_standard_keys_give_no_warning():
    cfg, notes = _notes(BASE)
    assert notes == [] and cfg.hidden_size == 64


@pytest.mark.parametrize("key, value", [
    ("mamba_d_state", 64), ("moe_num_experts", 16), ("global_head_dim", 256),
    ("hidden_size_per_layer_input", 256), ("num_shared_experts", 2),
    ("n_kv_groups", 4), ("expert_layer_period", [2, 2]),
])
def test_an_unread_dimension_is_named(key, value):
    cfg, notes = _notes({**BASE, key: value})
    assert [n.key for n in notes] == [key]
    assert str(notes[0]).startswith(f"config dict: config key '{key}'")
    assert cfg == ModelConfig.from_hf_config(BASE)          # read, not refused
    with pytest.raises(ValueError, match=f"strict=True.*'{key}'"):
        ModelConfig.from_hf_config({**BASE, key: value}, strict=True)


@pytest.mark.parametrize("key, value", [
    ("max_position_embeddings", 4096), ("sliding_window", 4096), ("first_k_dense_replace", 3),
    ("num_nextn_predict_layers", 1), ("n_group", 8), ("image_token_index", 5),
    ("pad_token_id", 0), ("eos_token_id", [1, 2]), ("rope_theta", 10000),
    ("partial_rotary_factor", 0.5), ("use_qk_norm", True), ("hidden_act", "silu"),
    ("vision_config", {"hidden_size": 1152}), ("chunk_size", 128), ("ep_size", 1),
])
def test_known_or_shapeless_keys_are_quiet(key, value):
    assert _notes({**BASE, key: value})[1] == []
    ModelConfig.from_hf_config({**BASE, key: value}, strict=True)


def test_unread_key_in_text_config_is_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gemma3", "text_config": {
        **BASE, "model_type": "gemma3_text", "num_key_value_heads": 4, "head_dim": 16,
        "laurel_rank": 64}}))
    _, notes = _notes(path)
    assert [n.key for n in notes] == ["laurel_rank"] and str(path) in str(notes[0])


@pytest.mark.parametrize("given", ["str", "path", "dir"])
def test_warnings_name_the_file_not_the_parameter(tmp_path, given):
    # A path: every ConfigWarning (and the strict refusal) starts with the
    # file it came from, never the parameter's name.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, "n_kv_groups": 4, "model_type": "minicpm"}))
    arg = {"str": str(path), "path": path, "dir": tmp_path}[given]
    _, notes = _notes(arg)
    assert [n.key for n in notes] == ["model_type", "n_kv_groups"]
    for n in notes:
        assert str(n).startswith(f"{path}: ") and "path_or_dict" not in str(n), str(n)
    with pytest.raises(ValueError, match="strict") as e:
        ModelConfig.from_hf_config(arg, strict=True)
    assert str(e.value).startswith(f"{path}: ")
    # a dict has no file: the label says what was given
    _, notes = _notes({**BASE, "n_kv_groups": 4})
    assert [str(n).split(": ")[0] for n in notes] == ["config dict"]


GEMMA3 = {"model_type": "gemma3", "text_config": {
    "model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504,
    "num_attention_heads": 32, "num_key_value_heads": 16, "num_hidden_layers": 62,
    "head_dim": 128}}


@pytest.mark.parametrize("missing, default", [
    ("head_dim", 256), ("num_hidden_layers", 26), ("num_key_value_heads", 4),
    ("num_attention_heads", 8), ("hidden_size", 2304), ("intermediate_size", 9216)])
def test_gemma3_default_taken_is_named(missing, default):
    # transformers' Gemma3TextConfig defaults (vocab_size=262208, hidden_size=2304,
    # intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
    # num_key_value_heads=4, head_dim=256): a text_config without one of its shape
    # keys takes the default, and says so, naming the key and the value.
    text = {k: v for k, v in GEMMA3["text_config"].items() if k != missing}
    cfg, notes = _notes({**GEMMA3, "text_config": text})
    assert getattr(cfg, missing) == default
    assert [n.key for n in notes] == [missing]
    msg = str(notes[0])
    assert msg.startswith("config dict: ") and f"'{missing}'" in msg
    assert f"{default:,}" in msg and "Gemma3TextConfig" in msg
    with pytest.raises(ValueError, match=f"strict=True.*'{missing}'"):
        ModelConfig.from_hf_config({**GEMMA3, "text_config": text}, strict=True)


def test_gemma3_vocab_default_is_quiet():
    # every published multimodal Gemma 3 file leaves vocab_size out: its
    # default (262,208, with the image tokens) is theirs, taken without a word
    cfg, notes = _notes(GEMMA3)
    assert notes == [] and cfg.vocab_size == 262208
    assert ModelConfig.from_hf_config(GEMMA3, strict=True) == cfg


def test_unknown_family_is_read_with_a_warning():
    data = {**BASE, "model_type": "minicpm", "num_experts": 8, "num_experts_per_tok": 2}
    cfg, notes = _notes(data)
    assert [n.key for n in notes] == ["model_type"] and "'minicpm'" in str(notes[0])
    # the standard keys, and the MoE rule: experts intermediate_size wide
    assert (cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size) == (64, 8, 256)
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig.from_hf_config(data, strict=True)
    _, notes = _notes({k: v for k, v in BASE.items() if k != "model_type"})
    assert [n.key for n in notes] == ["model_type"] and "no model_type" in str(notes[0])


def test_strict_names_every_key_and_is_a_bool():
    with pytest.raises(ValueError) as e:
        ModelConfig.from_hf_config({**BASE, "model_type": "x", "mamba_d_state": 1,
                                    "latent_dim": 2}, strict=True)
    for key in ("'model_type'", "'mamba_d_state'", "'latent_dim'"):
        assert key in str(e.value)
    with pytest.raises(TypeError, match="strict"):
        ModelConfig.from_hf_config(BASE, strict=1)


def test_warning_points_at_the_caller():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ModelConfig.from_hf_config({**BASE, "mamba_d_state": 1})
    assert caught[0].filename == __file__


def test_config_warning_is_a_user_warning():
    w = ConfigWarning("message", "k")
    assert isinstance(w, UserWarning) and w.key == "k" and str(w) == "message"
    assert ConfigWarning("m").key is None
    back = pickle.loads(pickle.dumps(w))
    assert (type(back), str(back), back.key) == (ConfigWarning, "message", "k")


@pytest.mark.parametrize("data, field, want", [
    # the first present wins: ChatGLM's padded vocabulary is what its LM head writes
    ({**BASE, "padded_vocab_size": 160}, "vocab_size", 160),
    ({**BASE, "num_local_experts": 4, "experts_per_token": 2}, "num_experts_per_tok", 2),
    ({**BASE, "num_local_experts": 4}, "moe_intermediate_size", 256),
    ({**BASE, "num_local_experts": 4, "moe_intermediate_size": 32}, "moe_intermediate_size", 32),
    ({**BASE, "n_routed_experts": 4, "moe_intermediate_size": 32, "n_shared_experts": 3},
     "shared_expert_intermediate_size", 96),
    ({**BASE, "n_routed_experts": 4, "moe_intermediate_size": 32, "n_shared_experts": 3,
      "moe_shared_expert_intermediate_size": 40}, "shared_expert_intermediate_size", 40),
    ({**BASE, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 32,
      "head_dim": 8}, "head_dim", 32),
    ({**BASE, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8}, "head_dim", 24),
    ({**BASE, "multi_query_attention": True, "multi_query_group_num": 2},
     "num_key_value_heads", 2),
    ({**BASE, "multi_query_attention": False, "multi_query_group_num": 2},
     "num_key_value_heads", 4),
    ({**BASE, "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default"}},
     "mrope_interleaved", True),
    ({**BASE, "rope_parameters": {"mrope_interleaved": True}}, "mrope_interleaved", True),
    ({**BASE, "rope_scaling": {"factor": 8.0}}, "mrope_interleaved", False),
])
def test_derivation_rules(data, field, want):
    cfg, notes = _notes(data)
    assert getattr(cfg, field) == want and notes == []


def test_rule_keys_have_json_types():
    with pytest.raises(TypeError, match="qk_nope_head_dim"):
        ModelConfig.from_hf_config({**BASE, "qk_nope_head_dim": "128"})
    with pytest.raises(TypeError, match="n_shared_experts"):
        ModelConfig.from_hf_config({**BASE, "n_shared_experts": 1.0})
    with pytest.raises(TypeError, match="layers_block_type"):
        ModelConfig.from_hf_config({**BASE, "layers_block_type": "MM*"})


def test_warnings_do_not_leak_a_half_built_config():
    # a bad value raises before anything is warned about
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="hidden_size"):
            ModelConfig.from_hf_config({**BASE, "hidden_size": -1, "mamba_d_state": 1})
    assert caught == []


def test_presets_pickle():
    for name in PRESET_FILES:
        c = ModelConfig.preset(name)
        assert pickle.loads(pickle.dumps(c)) == c
