"""The parameter list Hugging Face transformers builds for a model, derived from its config.json.

metrale lays a model's weights out from the names, dtypes and shapes of its parameters. For a
Hugging Face checkpoint those are the ones transformers (5.x) gives ``model.named_parameters()``
of the model class its config names; this module derives them from the config alone, with no
torch and no transformers, from each family's layer structure as transformers defines it: its
attention projections, MLP or mixture of experts (transformers 5 fuses a layer's experts into
two 3-D parameters, ``experts.gate_up_proj`` [E, 2*I, H] and ``experts.down_proj`` [E, H, I]),
norms, DeepSeek's multi-head latent attention, Gemma 3's SigLIP vision tower and projector.

A config field a family's config class gives a default is read with that default when the
config leaves it out (or sets it to null); the sizes that say how big the model is (hidden size,
layer and head counts, intermediate sizes, vocabulary, expert counts) are required, as a default
there would only describe some other model. The recorded lists of tests/test_weights_hf.py, each
made by transformers itself, are what this derivation is checked against.
"""

from collections.abc import Callable, Mapping

__all__ = ["hf_params", "SUPPORTED_MODEL_TYPES"]

_Shape = tuple[int, ...]
_MISSING = object()


# -- reading a config: required fields, HF's defaults, and types -------------------------------


class _Config:
    """A config mapping read field by field, for one model type (named in its errors)."""

    def __init__(self, mapping: Mapping[str, object], model_type: str, path: str = ""):
        self._map = mapping
        self.model_type = model_type
        self._path = path

    def _name(self, key: str) -> str:
        return self._path + key

    def _get(self, key: str, default: object) -> object:
        value = self._map.get(key)
        if value is None:
            if default is _MISSING:
                raise ValueError(f"hf_params: the {self.model_type} config lacks the required "
                                 f"field {self._name(key)!r}")
            return default
        return value

    def get_int(self, key: str, default: object = _MISSING, minimum: int = 1) -> int:
        """The int field `key` (`default` when absent or null; required when no default)."""
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"hf_params: the {self.model_type} config field {self._name(key)!r} "
                            f"must be an int, not {type(value).__name__} ({value!r})")
        if value < minimum:
            raise ValueError(f"hf_params: the {self.model_type} config field "
                             f"{self._name(key)!r} is {value}, below {minimum}")
        return value

    def get_opt_int(self, key: str, default: int) -> int | None:
        """An int field whose null means "none" (absent: `default`), as q_lora_rank's does."""
        if key in self._map and self._map[key] is None:
            return None
        return self.get_int(key, default)

    def get_bool(self, key: str, default: bool) -> bool:
        """The bool field `key` (`default` when absent or null)."""
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise TypeError(f"hf_params: the {self.model_type} config field {self._name(key)!r} "
                            f"must be a bool, not {type(value).__name__} ({value!r})")
        return value

    def get_ints(self, key: str) -> list[int]:
        """A list-of-ints field (absent or null: empty), as mlp_only_layers."""
        value = self._get(key, [])
        if not isinstance(value, (list, tuple)) or any(
                isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise TypeError(f"hf_params: the {self.model_type} config field {self._name(key)!r} "
                            f"must be a list of ints, not {value!r}")
        return list(value)

    def sub(self, key: str) -> "_Config":
        """The nested config `key` (text_config, vision_config), required; its errors name
        this config's model type and the field's path (vision_config.patch_size)."""
        value = self._get(key, _MISSING)
        if not isinstance(value, Mapping):
            raise TypeError(f"hf_params: the {self.model_type} config field {self._name(key)!r} "
                            f"must be a mapping, not {type(value).__name__}")
        return _Config(value, self.model_type, f"{self._path}{key}.")


def _dtype(config: Mapping[str, object]) -> str:
    """The config's dtype ("dtype", or the older "torch_dtype"), float32 when it names none."""
    value = config.get("dtype")
    if value is None:
        value = config.get("torch_dtype")
    if value is None:
        return "float32"
    if not isinstance(value, str):
        raise TypeError(f"hf_params: the config's dtype must be a str, not {value!r}")
    return value.removeprefix("torch.")


# -- the parameters, in registration order --------------------------------------------------


class _Params:
    """The parameters of one model, in the order its modules register them."""

    def __init__(self, dtype: str):
        self.dtype = dtype
        self.out: dict[str, tuple[str, _Shape]] = {}

    def add(self, name: str, *shape: int) -> None:
        self.out[name] = (self.dtype, tuple(shape))

    def linear(self, name: str, out_features: int, in_features: int, bias: bool = False) -> None:
        """nn.Linear: weight [out, in], then bias [out]."""
        self.add(f"{name}.weight", out_features, in_features)
        if bias:
            self.add(f"{name}.bias", out_features)

    def rms_norm(self, name: str, dim: int) -> None:
        self.add(f"{name}.weight", dim)

    def layer_norm(self, name: str, dim: int) -> None:
        """nn.LayerNorm: weight, then bias."""
        self.add(f"{name}.weight", dim)
        self.add(f"{name}.bias", dim)


def _attention(p: _Params, name: str, hidden: int, heads: int, kv_heads: int, head_dim: int, *,
               qkv_bias: bool = False, o_bias: bool = False, qk_norm: bool = False) -> None:
    """Grouped-query attention: q, k, v, o projections (then per-head q/k norms, Qwen3, Gemma3)."""
    p.linear(f"{name}.q_proj", heads * head_dim, hidden, qkv_bias)
    p.linear(f"{name}.k_proj", kv_heads * head_dim, hidden, qkv_bias)
    p.linear(f"{name}.v_proj", kv_heads * head_dim, hidden, qkv_bias)
    p.linear(f"{name}.o_proj", hidden, heads * head_dim, o_bias)
    if qk_norm:
        p.rms_norm(f"{name}.q_norm", head_dim)
        p.rms_norm(f"{name}.k_norm", head_dim)


def _gated_mlp(p: _Params, name: str, hidden: int, intermediate: int, bias: bool = False) -> None:
    """The gated MLP: gate_proj, up_proj [I, H], down_proj [H, I]."""
    p.linear(f"{name}.gate_proj", intermediate, hidden, bias)
    p.linear(f"{name}.up_proj", intermediate, hidden, bias)
    p.linear(f"{name}.down_proj", hidden, intermediate, bias)


def _experts(p: _Params, name: str, experts: int, hidden: int, intermediate: int) -> None:
    """transformers 5's fused experts: gate_up_proj [E, 2*I, H] and down_proj [E, H, I]."""
    p.add(f"{name}.gate_up_proj", experts, 2 * intermediate, hidden)
    p.add(f"{name}.down_proj", experts, hidden, intermediate)


def _router(p: _Params, name: str, experts: int, hidden: int) -> None:
    """A top-k router: weight [E, H] (DeepSeek-V3's e_score_correction_bias is a buffer)."""
    p.add(f"{name}.weight", experts, hidden)


def _norms(p: _Params, name: str, hidden: int, *names: str) -> None:
    for n in names or ("input_layernorm", "post_attention_layernorm"):
        p.rms_norm(f"{name}.{n}", hidden)


_Layer = Callable[[_Params, str, int], None]


def _decoder(p: _Params, c: _Config, base: str, layer: _Layer, *, tied: bool,
             vocab_default: object = _MISSING) -> None:
    """A decoder-only language model: embed_tokens, its layers, the final norm, and lm_head
    unless it is tied to embed_tokens (named_parameters then lists embed_tokens only)."""
    vocab = c.get_int("vocab_size", vocab_default)
    hidden = c.get_int("hidden_size")
    layers = c.get_int("num_hidden_layers", minimum=0)
    p.add(f"{base}.embed_tokens.weight", vocab, hidden)
    for i in range(layers):
        layer(p, f"{base}.layers.{i}", i)
    p.rms_norm(f"{base}.norm", hidden)
    if not tied:
        p.linear("lm_head", vocab, hidden)


def _heads(c: _Config, kv_default: int | None, head_dim_default: int | None) -> tuple[int, ...]:
    """hidden, heads, kv heads and head_dim, a default of None meaning HF's derived value:
    num_attention_heads for the kv heads, hidden_size // num_attention_heads for head_dim."""
    hidden = c.get_int("hidden_size")
    heads = c.get_int("num_attention_heads")
    kv = c.get_int("num_key_value_heads", heads if kv_default is None else kv_default)
    derived = hidden // heads if head_dim_default is None else head_dim_default
    head_dim = c.get_int("head_dim", derived)
    return hidden, heads, kv, head_dim


# -- the families -------------------------------------------------------------------------------


def _dense(c: _Config, p: _Params, *, kv_default: int | None, head_dim_default: int | None,
           tie_default: bool, qkv_bias: bool, o_bias: bool, mlp_bias: bool = False,
           qk_norm: bool = False, gemma_norms: bool = False, base: str = "model",
           tied: bool | None = None, vocab_default: object = _MISSING) -> None:
    """The Llama-like decoders: attention, gated MLP, two norms (Gemma 2 and 3: four)."""
    hidden, heads, kv, head_dim = _heads(c, kv_default, head_dim_default)
    intermediate = c.get_int("intermediate_size")
    norms = (("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
              "post_feedforward_layernorm") if gemma_norms else ())

    def layer(p: _Params, name: str, i: int) -> None:
        _attention(p, f"{name}.self_attn", hidden, heads, kv, head_dim,
                   qkv_bias=qkv_bias, o_bias=o_bias, qk_norm=qk_norm)
        _gated_mlp(p, f"{name}.mlp", hidden, intermediate, mlp_bias)
        _norms(p, name, hidden, *norms)

    if tied is None:
        tied = c.get_bool("tie_word_embeddings", tie_default)
    _decoder(p, c, base, layer, tied=tied, vocab_default=vocab_default)


def _llama(c: _Config, p: _Params) -> None:
    bias = c.get_bool("attention_bias", False)
    _dense(c, p, kv_default=None, head_dim_default=None, tie_default=False,
           qkv_bias=bias, o_bias=bias, mlp_bias=c.get_bool("mlp_bias", False))


def _mistral(c: _Config, p: _Params) -> None:
    _dense(c, p, kv_default=8, head_dim_default=None, tie_default=False,
           qkv_bias=False, o_bias=False)


def _qwen2(c: _Config, p: _Params) -> None:
    _dense(c, p, kv_default=32, head_dim_default=None, tie_default=False,
           qkv_bias=True, o_bias=False)


def _qwen3(c: _Config, p: _Params) -> None:
    bias = c.get_bool("attention_bias", False)
    _dense(c, p, kv_default=32, head_dim_default=128, tie_default=False,
           qkv_bias=bias, o_bias=bias, qk_norm=True)


def _gemma2(c: _Config, p: _Params) -> None:
    bias = c.get_bool("attention_bias", False)
    _dense(c, p, kv_default=4, head_dim_default=256, tie_default=True,
           qkv_bias=bias, o_bias=bias, gemma_norms=True)


def _gemma3_text(c: _Config, p: _Params, base: str = "model", tied: bool | None = None) -> None:
    # Gemma3TextConfig defaults vocab_size to Gemma 3's own vocabulary, which Gemma 3's
    # multimodal configs leave out of their text_config.
    bias = c.get_bool("attention_bias", False)
    _dense(c, p, kv_default=4, head_dim_default=256, tie_default=True,
           qkv_bias=bias, o_bias=bias, qk_norm=True, gemma_norms=True, base=base, tied=tied,
           vocab_default=262_208)


def _siglip_vision(v: _Config, p: _Params, name: str) -> int:
    """SigLIP's vision tower (SiglipVisionModel): patch and position embeddings, encoder
    layers, post_layernorm, and the attention-pooling head unless vision_use_head is false.
    Returns its hidden size."""
    hidden = v.get_int("hidden_size")
    intermediate = v.get_int("intermediate_size")
    layers = v.get_int("num_hidden_layers", minimum=0)
    heads = v.get_int("num_attention_heads")
    channels = v.get_int("num_channels", 3)
    image, patch = v.get_int("image_size"), v.get_int("patch_size")
    del heads  # the head count shapes no parameter: each projection is [hidden, hidden]

    def mlp(name: str) -> None:
        p.linear(f"{name}.fc1", intermediate, hidden, bias=True)
        p.linear(f"{name}.fc2", hidden, intermediate, bias=True)

    p.add(f"{name}.embeddings.patch_embedding.weight", hidden, channels, patch, patch)
    p.add(f"{name}.embeddings.patch_embedding.bias", hidden)
    p.add(f"{name}.embeddings.position_embedding.weight", (image // patch) ** 2, hidden)
    for i in range(layers):
        layer = f"{name}.encoder.layers.{i}"
        p.layer_norm(f"{layer}.layer_norm1", hidden)
        for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
            p.linear(f"{layer}.self_attn.{proj}", hidden, hidden, bias=True)
        p.layer_norm(f"{layer}.layer_norm2", hidden)
        mlp(f"{layer}.mlp")
    p.layer_norm(f"{name}.post_layernorm", hidden)
    if v.get_bool("vision_use_head", True):
        p.add(f"{name}.head.probe", 1, 1, hidden)
        p.add(f"{name}.head.attention.in_proj_weight", 3 * hidden, hidden)   # nn.MultiheadAttention
        p.add(f"{name}.head.attention.in_proj_bias", 3 * hidden)
        p.linear(f"{name}.head.attention.out_proj", hidden, hidden, bias=True)
        p.layer_norm(f"{name}.head.layernorm", hidden)
        mlp(f"{name}.head.mlp")
    return hidden


def _gemma3(c: _Config, p: _Params) -> None:
    """Gemma3ForConditionalGeneration: model.vision_tower (SigLIP), model.multi_modal_projector,
    model.language_model (Gemma 3 text), lm_head tied per the top-level config (default True)."""
    text = c.sub("text_config")
    vision = c.sub("vision_config")
    tied = c.get_bool("tie_word_embeddings", True)
    vision_hidden = _siglip_vision(vision, p, "model.vision_tower")
    p.add("model.multi_modal_projector.mm_input_projection_weight",
          vision_hidden, text.get_int("hidden_size"))
    p.rms_norm("model.multi_modal_projector.mm_soft_emb_norm", vision_hidden)
    _gemma3_text(text, p, base="model.language_model", tied=tied)


def _phi3(c: _Config, p: _Params) -> None:
    """Phi-3: o_proj then a fused qkv_proj; a fused gate_up_proj [2*I, H] MLP."""
    hidden, heads, kv, head_dim = _heads(c, None, None)
    intermediate = c.get_int("intermediate_size")

    def layer(p: _Params, name: str, i: int) -> None:
        p.linear(f"{name}.self_attn.o_proj", hidden, heads * head_dim)
        p.linear(f"{name}.self_attn.qkv_proj", (heads + 2 * kv) * head_dim, hidden)
        p.linear(f"{name}.mlp.gate_up_proj", 2 * intermediate, hidden)
        p.linear(f"{name}.mlp.down_proj", hidden, intermediate)
        _norms(p, name, hidden)

    _decoder(p, c, "model", layer, tied=c.get_bool("tie_word_embeddings", False))


def _mixtral(c: _Config, p: _Params) -> None:
    """Mixtral: every layer a sparse MoE block (router, then the experts)."""
    hidden, heads, kv, head_dim = _heads(c, 8, None)
    intermediate = c.get_int("intermediate_size")
    experts = c.get_int("num_local_experts")

    def layer(p: _Params, name: str, i: int) -> None:
        _attention(p, f"{name}.self_attn", hidden, heads, kv, head_dim)
        _router(p, f"{name}.mlp.gate", experts, hidden)
        _experts(p, f"{name}.mlp.experts", experts, hidden, intermediate)
        _norms(p, name, hidden)

    _decoder(p, c, "model", layer, tied=c.get_bool("tie_word_embeddings", False))


def _is_sparse(c: _Config, experts: int) -> Callable[[int], bool]:
    """Qwen-MoE's choice of a sparse layer: not in mlp_only_layers, and every
    decoder_sparse_step-th layer (1-based) when there are experts."""
    step = c.get_int("decoder_sparse_step", 1)
    dense_only = set(c.get_ints("mlp_only_layers"))
    return lambda i: i not in dense_only and experts > 0 and (i + 1) % step == 0


def _qwen_moe(c: _Config, p: _Params, *, qwen3: bool) -> None:
    """Qwen2-MoE (router, experts, a shared expert and its gate; q/k/v biases) and Qwen3-MoE
    (experts, then router; q/k norms); their dense layers are gated MLPs."""
    hidden, heads, kv, head_dim = _heads(c, 4 if qwen3 else 16, None)
    experts = c.get_int("num_experts", minimum=0)
    moe_intermediate = c.get_int("moe_intermediate_size")
    shared = 0 if qwen3 else c.get_int("shared_expert_intermediate_size")
    sparse = _is_sparse(c, experts)
    if qwen3:
        bias = c.get_bool("attention_bias", False)
        qkv_bias, o_bias = bias, bias
    else:
        qkv_bias, o_bias = c.get_bool("qkv_bias", True), False

    def layer(p: _Params, name: str, i: int) -> None:
        _attention(p, f"{name}.self_attn", hidden, heads, kv, head_dim,
                   qkv_bias=qkv_bias, o_bias=o_bias, qk_norm=qwen3)
        mlp = f"{name}.mlp"
        if not sparse(i):
            _gated_mlp(p, mlp, hidden, c.get_int("intermediate_size"))
        elif qwen3:
            _experts(p, f"{mlp}.experts", experts, hidden, moe_intermediate)
            _router(p, f"{mlp}.gate", experts, hidden)
        else:
            _router(p, f"{mlp}.gate", experts, hidden)
            _experts(p, f"{mlp}.experts", experts, hidden, moe_intermediate)
            _gated_mlp(p, f"{mlp}.shared_expert", hidden, shared)
            p.linear(f"{mlp}.shared_expert_gate", 1, hidden)
        _norms(p, name, hidden)

    _decoder(p, c, "model", layer, tied=c.get_bool("tie_word_embeddings", False))


def _qwen2_moe(c: _Config, p: _Params) -> None:
    _qwen_moe(c, p, qwen3=False)


def _qwen3_moe(c: _Config, p: _Params) -> None:
    _qwen_moe(c, p, qwen3=True)


def _mla(p: _Params, name: str, c: _Config, hidden: int, heads: int) -> None:
    """DeepSeek's multi-head latent attention: q (through a low-rank q_a/q_b pair unless
    q_lora_rank is null), the shared compressed kv_a_proj_with_mqa, kv_b_proj, o_proj."""
    bias = c.get_bool("attention_bias", False)
    q_rank = c.get_opt_int("q_lora_rank", 1536)
    kv_rank = c.get_int("kv_lora_rank", 512)
    rope, nope = c.get_int("qk_rope_head_dim", 64), c.get_int("qk_nope_head_dim", 128)
    v_dim = c.get_int("v_head_dim", 128)
    if q_rank is None:
        p.linear(f"{name}.q_proj", heads * (nope + rope), hidden)
    else:
        p.linear(f"{name}.q_a_proj", q_rank, hidden, bias)
        p.rms_norm(f"{name}.q_a_layernorm", q_rank)
        p.linear(f"{name}.q_b_proj", heads * (nope + rope), q_rank)
    p.linear(f"{name}.kv_a_proj_with_mqa", kv_rank + rope, hidden, bias)
    p.rms_norm(f"{name}.kv_a_layernorm", kv_rank)
    p.linear(f"{name}.kv_b_proj", heads * (nope + v_dim), kv_rank)
    p.linear(f"{name}.o_proj", hidden, heads * v_dim, bias)


def _deepseek(c: _Config, p: _Params, *, v3: bool) -> None:
    """DeepSeek-V2 and V3: MLA, dense gated MLPs in the first first_k_dense_replace layers,
    MoE after (experts, router, shared_experts of n_shared_experts * moe_intermediate_size).
    V3's multi-token-prediction layers (num_nextn_predict_layers) are not built by transformers."""
    hidden, heads = c.get_int("hidden_size"), c.get_int("num_attention_heads")
    dense_layers = c.get_int("first_k_dense_replace", 3 if v3 else 0, minimum=0)
    experts = c.get_int("n_routed_experts")
    moe_intermediate = c.get_int("moe_intermediate_size")
    shared = c.get_int("n_shared_experts", 1 if v3 else 2, minimum=0) * moe_intermediate
    mlp_bias = False if v3 else c.get_bool("mlp_bias", False)

    def layer(p: _Params, name: str, i: int) -> None:
        _mla(p, f"{name}.self_attn", c, hidden, heads)
        mlp = f"{name}.mlp"
        if i < dense_layers:
            _gated_mlp(p, mlp, hidden, c.get_int("intermediate_size"), mlp_bias)
        else:
            _experts(p, f"{mlp}.experts", experts, hidden, moe_intermediate)
            _router(p, f"{mlp}.gate", experts, hidden)
            _gated_mlp(p, f"{mlp}.shared_experts", hidden, shared, mlp_bias)
        _norms(p, name, hidden)

    _decoder(p, c, "model", layer, tied=c.get_bool("tie_word_embeddings", False))


def _deepseek_v2(c: _Config, p: _Params) -> None:
    _deepseek(c, p, v3=False)


def _deepseek_v3(c: _Config, p: _Params) -> None:
    _deepseek(c, p, v3=True)


# model_type: (the architecture derived, its derivation)
_FAMILIES: dict[str, tuple[str, Callable[[_Config, _Params], None]]] = {
    "llama": ("LlamaForCausalLM", _llama),
    "mistral": ("MistralForCausalLM", _mistral),
    "qwen2": ("Qwen2ForCausalLM", _qwen2),
    "qwen3": ("Qwen3ForCausalLM", _qwen3),
    "qwen3_moe": ("Qwen3MoeForCausalLM", _qwen3_moe),
    "gemma3": ("Gemma3ForConditionalGeneration", _gemma3),
    "gemma3_text": ("Gemma3ForCausalLM", _gemma3_text),
    "deepseek_v3": ("DeepseekV3ForCausalLM", _deepseek_v3),
    "mixtral": ("MixtralForCausalLM", _mixtral),
    "qwen2_moe": ("Qwen2MoeForCausalLM", _qwen2_moe),
    "deepseek_v2": ("DeepseekV2ForCausalLM", _deepseek_v2),
    "gemma2": ("Gemma2ForCausalLM", _gemma2),
    "phi3": ("Phi3ForCausalLM", _phi3),
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(_FAMILIES)


def hf_params(config: Mapping[str, object]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The parameters transformers builds for the model a config.json describes.

    Derived from the config alone (no torch, no transformers), per each supported family's
    layer structure in transformers 5: the names, dtypes and shapes that
    ``model.named_parameters()`` of the config's architecture gives, in that order.

    Parameters
    ----------
    config : Mapping[str, object]
        A parsed Hugging Face config.json. Its ``model_type`` picks the family (one of
        `SUPPORTED_MODEL_TYPES`); its ``architectures``, when given, must name the class
        derived for it (``LlamaForCausalLM`` for llama, ``Gemma3ForConditionalGeneration``
        for gemma3, ...). The sizes that make the model (hidden size, layer, head and
        expert counts, intermediate sizes, vocabulary size) are required; every other
        field left out or null takes the default of its transformers config class
        (num_key_value_heads, head_dim, biases, tie_word_embeddings, which layers are
        dense, DeepSeek's latent ranks, ...).

    Returns
    -------
    dict[str, tuple[str, tuple[int, ...]]]
        Each parameter's name mapped to its ``(dtype, shape)``, in named_parameters order.
        The dtype is the config's ``dtype`` (or ``torch_dtype``), "float32" when it names
        none; its ``quantization_config`` is ignored. A parameter tied to another (lm_head
        when tie_word_embeddings holds) is left out, as named_parameters leaves it out.

    Raises
    ------
    TypeError
        If `config` is not a mapping, or a field has the wrong type (a str or a bool where
        an int is needed, ...); the message names the field.
    ValueError
        If the model type or architecture is not one derived here (the message names it
        and the supported types), or a required field is missing (the message names it
        and the model type).
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"hf_params: config must be a mapping (a parsed config.json), "
                        f"not {type(config).__name__}")
    model_type = config.get("model_type")
    if model_type is None:
        raise ValueError("hf_params: the config lacks the required field 'model_type'")
    if not isinstance(model_type, str):
        raise TypeError(f"hf_params: the config field 'model_type' must be a str, "
                        f"not {model_type!r}")
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if model_type not in _FAMILIES:
        raise ValueError(f"hf_params: model_type {model_type!r} is not supported "
                         f"(supported: {supported})")
    architecture, derive = _FAMILIES[model_type]
    architectures = config.get("architectures")
    if architectures is not None:
        if not isinstance(architectures, (list, tuple)) or not all(
                isinstance(a, str) for a in architectures):
            raise TypeError(f"hf_params: the config field 'architectures' must be a list of "
                            f"str, not {architectures!r}")
        if architectures and architectures[0] != architecture:
            raise ValueError(f"hf_params: architecture {architectures[0]!r} of model_type "
                             f"{model_type!r} is not supported (derived: {architecture} for "
                             f"{model_type}; supported model types: {supported})")
    params = _Params(_dtype(config))
    derive(_Config(config, model_type), params)
    return params.out
