"""metrale's own derivation of a Hugging Face model's parameters from its config.json
(metrale._integrations._hf_params), checked against what transformers itself builds.

The expectations are recorded, not derived: each tests/data/hf_params/*.json.gz was written
by transformers 5.17 from the config of the same name under tests/data/hf/ (the model
class's named_parameters(): names in order, dtypes, shapes, and the state-dict names tied to
another parameter). A record whose model type is supported must match it exactly; one whose
model type is not must be refused by name."""

import copy
import gzip
import json
import pathlib

import pytest

from metrale._integrations._hf_params import SUPPORTED_MODEL_TYPES, hf_params

DATA = pathlib.Path(__file__).parent / "data"
RECORDS = sorted((DATA / "hf_params").glob("*.json.gz"))
# The families that must be among the records matched (a record skipped as unsupported
# would otherwise pass unseen).
REQUIRED = {"llama-3.1-8b", "qwen3-8b", "qwen3-30b-a3b", "gemma-3-27b", "deepseek-v3"}


def _record(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def _config(name):
    return json.loads((DATA / "hf" / name).read_text())


def _stem(path):
    return path.name.removesuffix(".json.gz")


def _supported(path):
    return _config(_record(path)["config"]).get("model_type") in SUPPORTED_MODEL_TYPES


SUPPORTED = [p for p in RECORDS if _supported(p)]
UNSUPPORTED = [p for p in RECORDS if not _supported(p)]


def _first_difference(got, expected):
    """Where two (name, dtype, shape) lists first differ, in words; None where they agree."""
    for i, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            return f"parameter {i}: derived {g}, recorded {e}"
    if len(got) != len(expected):
        i = min(len(got), len(expected))
        extra = got[i] if len(got) > i else expected[i]
        side = "derived" if len(got) > i else "recorded"
        return (f"parameter {i}: {len(got)} derived, {len(expected)} recorded; "
                f"the first one only {side}: {extra}")
    return None


def test_first_difference_names_the_first_differing_parameter():
    a = [("x", "bfloat16", (2,)), ("y", "bfloat16", (3,))]
    assert _first_difference(a, list(a)) is None
    b = [("x", "bfloat16", (2,)), ("y", "float32", (3,))]
    assert "parameter 1" in _first_difference(a, b) and "'y'" in _first_difference(a, b)
    assert "only recorded: ('y'" in _first_difference(a[:1], a)
    assert "only derived: ('y'" in _first_difference(a, a[:1])


@pytest.mark.parametrize("path", SUPPORTED, ids=[p.name for p in SUPPORTED])
def test_the_derived_parameters_are_the_recorded_ones(path):
    record = _record(path)
    got = [(name, dtype, shape) for name, (dtype, shape) in
           hf_params(_config(record["config"])).items()]
    expected = [(name, dtype, tuple(shape)) for name, dtype, shape in record["params"]]
    assert all(isinstance(s, tuple) and all(type(n) is int for n in s) for _, _, s in got)
    difference = _first_difference(got, expected)
    assert difference is None, f"{record['config']} ({record['class']}): {difference}"
    # a tied parameter is not among them
    assert not set(record["tied"]) & {name for name, _, _ in got}


@pytest.mark.parametrize("stem", sorted(REQUIRED))
def test_the_weight_set_of_a_config_is_transformers_list_laid_out(stem):
    """metrale.weights.weight_set of the derived list: the recorded names, dtypes and shapes
    in order, each at the previous end rounded up to 256 bytes, its bytes numel * itemsize."""
    from metrale.weights import weight_set
    record = _record(DATA / "hf_params" / f"{stem}.json.gz")
    ws = weight_set(hf_params(_config(record["config"])))
    itemsize = {"bfloat16": 2, "float16": 2, "float32": 4}
    at = 0
    assert len(ws) == len(record["params"])
    for p, (name, dtype, shape) in zip(ws, record["params"]):
        assert (p.name, p.dtype, p.shape) == (name, dtype, tuple(shape))
        n = itemsize[dtype]
        for d in shape:
            n *= d
        assert (p.offset, p.nbytes) == ((at + 255) // 256 * 256, n), name
        at = p.offset + n
    assert ws.nbytes >= at


def test_the_required_families_are_among_the_records_matched():
    assert REQUIRED <= {_stem(p) for p in SUPPORTED}


@pytest.mark.parametrize("path", UNSUPPORTED, ids=[p.name for p in UNSUPPORTED])
def test_an_unsupported_model_type_is_refused_by_name(path):
    config = _config(_record(path)["config"])
    with pytest.raises(ValueError, match=repr(config["model_type"])) as e:
        hf_params(config)
    assert all(t in str(e.value) for t in SUPPORTED_MODEL_TYPES)


def test_the_supported_model_types():
    assert isinstance(SUPPORTED_MODEL_TYPES, tuple)
    assert {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma3",
            "deepseek_v3"} <= set(SUPPORTED_MODEL_TYPES)


def test_an_unknown_model_type_is_refused():
    with pytest.raises(ValueError, match="'no_such_model'.*supported: llama"):
        hf_params({"model_type": "no_such_model"})
    with pytest.raises(ValueError, match="'model_type'"):
        hf_params({"hidden_size": 16})


def test_an_architecture_not_derived_is_refused():
    config = _config("llama-3.1-8b.json")
    config["architectures"] = ["LlamaForSequenceClassification"]
    with pytest.raises(ValueError, match="LlamaForSequenceClassification"):
        hf_params(config)


def test_a_missing_required_field_is_named():
    config = _config("llama-3.1-8b.json")
    del config["hidden_size"]
    with pytest.raises(ValueError, match="llama.*'hidden_size'"):
        hf_params(config)
    config = _config("gemma-3-27b.json")
    del config["vision_config"]["patch_size"]
    with pytest.raises(ValueError, match="gemma3.*'vision_config.patch_size'"):
        hf_params(config)
    config = _config("deepseek-v3.json")
    del config["n_routed_experts"]
    with pytest.raises(ValueError, match="deepseek_v3.*'n_routed_experts'"):
        hf_params(config)


@pytest.mark.parametrize("field, value", [
    ("num_hidden_layers", "32"), ("num_attention_heads", True), ("intermediate_size", 14336.0),
    ("attention_bias", "false"), ("tie_word_embeddings", 1)])
def test_a_field_of_the_wrong_type_is_named(field, value):
    config = _config("llama-3.1-8b.json")
    config[field] = value
    with pytest.raises(TypeError, match=repr(field)):
        hf_params(config)


def test_a_config_that_is_not_a_mapping_is_refused():
    for config in (None, '{"model_type": "llama"}', [("model_type", "llama")]):
        with pytest.raises(TypeError, match="mapping"):
            hf_params(config)
    config = _config("gemma-3-27b.json")
    config["text_config"] = "gemma3_text"
    with pytest.raises(TypeError, match="'text_config'"):
        hf_params(config)


def test_tie_word_embeddings_leaves_lm_head_out():
    tied = _config("llama-3.2-3b.json")
    assert tied["tie_word_embeddings"] is True
    untied = _config("llama-3.1-8b.json")
    assert untied["tie_word_embeddings"] is False
    assert "lm_head.weight" not in hf_params(tied)
    assert hf_params(untied)["lm_head.weight"] == ("bfloat16", (128256, 4096))
    flipped = copy.deepcopy(tied)
    flipped["tie_word_embeddings"] = False
    params = hf_params(flipped)
    assert list(params)[-1] == "lm_head.weight" and len(params) == len(hf_params(tied)) + 1
    # Llama's default is untied; Gemma's is tied
    del untied["tie_word_embeddings"]
    assert "lm_head.weight" in hf_params(untied)
    gemma = _config("gemma-2-9b.json")
    assert "tie_word_embeddings" not in gemma and "lm_head.weight" not in hf_params(gemma)


def test_defaults_of_the_optional_fields():
    config = _config("llama-3.1-8b.json")
    for field in ("num_key_value_heads", "attention_bias", "mlp_bias"):
        del config[field]
    params = hf_params(config)
    # num_key_value_heads defaults to num_attention_heads, head_dim to hidden // heads
    assert params["model.layers.0.self_attn.k_proj.weight"] == ("bfloat16", (4096, 4096))
    assert "model.layers.0.self_attn.q_proj.bias" not in params
    config["attention_bias"] = True
    assert hf_params(config)["model.layers.0.self_attn.o_proj.bias"] == ("bfloat16", (4096,))
    # no dtype: float32; quantization_config changes nothing
    del config["torch_dtype"]
    config["quantization_config"] = {"quant_method": "fp8"}
    assert {d for d, _ in hf_params(config).values()} == {"float32"}
    config["dtype"] = "float16"
    assert {d for d, _ in hf_params(config).values()} == {"float16"}


def test_deepseek_dense_and_moe_layers():
    config = _config("deepseek-v3.json")
    config.update(num_hidden_layers=4, first_k_dense_replace=1, q_lora_rank=None)
    params = hf_params(config)
    assert "model.layers.0.mlp.gate_proj.weight" in params
    assert params["model.layers.1.mlp.experts.gate_up_proj"] == ("bfloat16", (256, 4096, 7168))
    assert params["model.layers.1.self_attn.q_proj.weight"] == ("bfloat16", (128 * 192, 7168))
    assert "model.layers.1.self_attn.q_a_proj.weight" not in params
    assert not any(".layers.4." in name for name in params)     # no multi-token-prediction layer
