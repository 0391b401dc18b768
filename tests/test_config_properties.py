"""Property-based tests (hypothesis) of ModelConfig, its presets and
from_hf_config: a call either succeeds with a config that satisfies the
contract or raises TypeError / ValueError naming what was wrong.

Profiles (conftest.py): "ci" is deterministic with a bounded example count;
METRALE_HYPOTHESIS_PROFILE=long runs many more examples locally.
"""

import json
import os
import tempfile
import warnings

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402

from metrale import ConfigWarning, ModelConfig  # noqa: E402
from metrale.config import FIELDS  # noqa: E402

from strategies import ARG_ERRORS, _names_argument, anything, junk, wide_ints  # noqa: E402


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
              st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
HF_KEYS = sorted(set(FIELDS) | {"n_embd", "n_embed", "n_layer", "n_head", "n_inner",
                                "num_kv_heads", "ffn_hidden_size", "multi_query", "text_config",
                                "n_routed_experts", "num_local_experts", "attn_output_gate",
                                "hybrid_override_pattern", "moe_shared_expert_intermediate_size",
                                "qk_nope_head_dim", "v_head_dim", "n_shared_experts",
                                "layers_block_type", "rope_scaling", "padded_vocab_size",
                                "multi_query_attention", "multi_query_group_num",
                                "mamba_d_state", "max_position_embeddings", "pad_token_id"})
SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
         "intermediate_size": 256}


# -- ModelConfig, presets, from_hf_config -----------------------------------------------------

@given(st.dictionaries(st.sampled_from(FIELDS), anything, max_size=6))
def test_model_config_fields(fields):
    try:
        c = ModelConfig(**fields)
    except ARG_ERRORS as e:
        assert _names_argument(e, *fields), e
        return
    for k, v in fields.items():
        got = getattr(c, k)
        if k in ("attn_gated", "mrope_interleaved", "model_type"):
            assert got == v
        elif k == "layer_types":
            assert got == tuple(v)
        else:
            assert type(got) is int and got == int(v) and 0 <= got < 2**64


@given(st.one_of(st.sampled_from(ModelConfig.presets()), st.text(max_size=12), junk))
def test_presets(name):
    try:
        c = ModelConfig.preset(name)
    except ARG_ERRORS as e:
        assert "name" in str(e) or "preset" in str(e)
        return
    assert isinstance(c, ModelConfig) and name in ModelConfig.presets()


@given(st.dictionaries(st.sampled_from(HF_KEYS), st.one_of(json_values, wide_ints), max_size=8),
       st.booleans())
def test_from_hf_config_dicts(data, with_shape):
    if with_shape:
        data = {**SHAPE, **data}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            c = ModelConfig.from_hf_config(data)
    except ARG_ERRORS as e:
        assert str(e).startswith(("config dict: ", "path_or_dict")) or "ModelConfig field" in str(e), e
        return
    assert c.hidden_size == data.get("hidden_size", data.get("n_embd", data.get("n_embed", c.hidden_size)))
    # every warning names a key of the config (or its model_type, or a key its
    # family's default stood in for); strict refuses exactly when something was
    # warned about, naming the same keys
    keys = [w.message.key for w in caught if issubclass(w.category, ConfigWarning)]
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else {}
    from metrale._sizing._hf_tables import _FAMILY_OF
    family = text.get("model_type") if isinstance(text.get("model_type"), str) and \
        text.get("model_type") else data.get("model_type")
    fam = _FAMILY_OF.get(family) if isinstance(family, str) else None
    defaulted = set(fam.defaults) - set(fam.quiet) if fam else set()
    assert all(k == "model_type" or k in data or k in text or k in defaulted
               for k in keys), keys
    if not isinstance(family, str) or family not in _FAMILY_OF:
        assert "model_type" in keys
    with pytest.raises(ValueError) as e:
        ModelConfig.from_hf_config(data, strict=True)
    assert all(repr(k) in str(e.value) for k in keys)


@given(st.one_of(json_values.map(json.dumps),
                 st.dictionaries(st.sampled_from(HF_KEYS), json_values).map(
                     lambda d: json.dumps({**SHAPE, **d})),
                 st.text(max_size=40), st.binary(max_size=40)))
def test_from_hf_config_files(text):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "config.json")
        with open(path, "wb") as f:
            f.write(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        for arg in (path, d):                       # the file, or its directory
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ConfigWarning)   # test_hf.py checks them
                    ModelConfig.from_hf_config(arg)
            except ARG_ERRORS as e:
                assert path in str(e) or "ModelConfig field" in str(e), e


@given(st.text(max_size=300))
def test_from_hf_config_path_strings(path):
    try:
        ModelConfig.from_hf_config(path)
    except ARG_ERRORS:
        pass
    except OSError:
        assert not os.path.isfile(path)             # only a path that names no file
