"""What ``ModelConfig.from_hf_config`` reads of a Hugging Face ``config.json``,
written once as four tables (docs/hf-config.md is generated from them by
tools/gen_docs.py): the families it knows (with the defaults of their
transformers config class for keys a published file leaves out), the config
keys each field is read from, the rules that derive a field no key gives, and
the keys known not to change any per-pass buffer size.  Any other key whose
name and value look like a model dimension is reported (metrale._sizing._hf:
ConfigWarning, or ValueError with strict=True), never silently dropped.
Pure Python.
"""

from .._base._fields import _INT_FIELDS
from .._base._record import Record


class _Family(Record):
    """A family of configs: its ``model_type`` values, its name in the docs,
    the shape defaults its transformers config class (`source`) gives keys
    that the published files leave out, and which of those defaults are
    taken without a warning (`quiet`: every published file of the family
    leaves the key out and the default is theirs).  Any other default taken
    is reported, naming the key and the value: a default is a guess at the
    model's shape."""

    __slots__ = ("model_types", "name", "defaults", "source", "quiet")
    _defaults = {"source": "", "quiet": ()}


class _Key(Record):
    """A field read from config keys: the first key present wins."""

    __slots__ = ("field", "keys", "note")


class _Rule(Record):
    """A field derived when its keys do not give it: `reads` are the config
    keys the rule consumes, `text` the rule as the docs state it, `apply`
    the function ``apply(out, ctx)`` that sets it."""

    __slots__ = ("field", "reads", "text", "apply")


class _Ignored(Record):
    """Config keys (``*`` matches any text) that may look like dimensions but
    change no per-pass buffer size, and why."""

    __slots__ = ("keys", "reason")


_GEMMA3_TEXT_DEFAULTS = dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216,
                             num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                             head_dim=256)

_FAMILIES = (
    _Family(("llama",), "Llama 2, 3, 3.1, 3.2, 3.3", {}),
    _Family(("mistral",), "Mistral 7B", {}),
    _Family(("mixtral",), "Mixtral 8x7B, 8x22B", {}),
    _Family(("qwen2",), "Qwen2, Qwen2.5 (dense)", {}),
    _Family(("qwen2_moe",), "Qwen1.5-MoE, Qwen2-MoE", {}),
    _Family(("qwen2_vl", "qwen2_5_vl"), "Qwen2-VL, Qwen2.5-VL (the language model)", {}),
    _Family(("qwen3",), "Qwen3", {}),
    _Family(("qwen3_moe",), "Qwen3-MoE", {}),
    _Family(("qwen3_next",), "Qwen3-Next", {}),
    _Family(("deepseek_v2",), "DeepSeek-V2, V2-Lite", {}),
    _Family(("deepseek_v3",), "DeepSeek-V3, R1", {}),
    _Family(("gemma2",), "Gemma 2", {}),
    # The multimodal checkpoints' text_config never gives vocab_size (262,208
    # is theirs, with the image tokens); the 4B and 12B ones leave out the
    # heads or head_dim too, and are warned about (27B gives head_dim 128).
    _Family(("gemma3", "gemma3_text"), "Gemma 3", _GEMMA3_TEXT_DEFAULTS, "Gemma3TextConfig",
            ("vocab_size",)),
    _Family(("phi3",), "Phi-3, Phi-3.5, Phi-4", {}),
    _Family(("gpt_oss",), "gpt-oss", {}),
    _Family(("nemotron_h",), "Nemotron-H, Nemotron 3 Nano", {}),
    _Family(("chatglm",), "ChatGLM3, GLM-4 (THUDM checkpoints)", {}),
    _Family(("glm", "glm4"), "GLM-4 (transformers checkpoints)", {}),
    _Family(("glm4_moe",), "GLM-4.5, 4.6, 4.7", {}),
    _Family(("glm4_moe_lite",), "GLM-4.7-Flash", {}),
    _Family(("gpt2",), "GPT-2", {}),
    _Family(("gpt_neox",), "GPT-NeoX", {}),
    _Family(("falcon", "RefinedWeb", "RefinedWebModel"), "Falcon", {}),
    _Family(("bloom",), "BLOOM", {}),
)
_FAMILY_OF = {t: f for f in _FAMILIES for t in f.model_types}

# Field <- keys beyond its own name, first present wins (every field is read
# from its own name; the aliases come from the families that spell it
# otherwise).
_ALIASES = {
    "hidden_size": (("n_embd", "n_embed"), "`n_embd`: GPT-2; `n_embed`: BLOOM"),
    "num_hidden_layers": (("n_layer", "num_layers"),
                          "`n_layer`: GPT-2, BLOOM, Falcon; `num_layers`: ChatGLM"),
    "num_attention_heads": (("n_head",), "`n_head`: GPT-2, Falcon"),
    "num_key_value_heads": (("num_kv_heads",), "`num_kv_heads`: Falcon"),
    "head_dim": (("attention_head_dim", "kv_channels"),
                 "`attention_head_dim`: Nemotron-H; `kv_channels`: ChatGLM"),
    "intermediate_size": (("n_inner", "ffn_hidden_size"),
                          "`n_inner`: GPT-2; `ffn_hidden_size`: Falcon, ChatGLM"),
    "num_experts": (("n_routed_experts", "num_local_experts"),
                    "`n_routed_experts`: DeepSeek, GLM-4.5, Nemotron-H; `num_local_experts`: "
                    "Mixtral, gpt-oss"),
    "num_experts_per_tok": (("experts_per_token",), "`experts_per_token`: gpt-oss"),
    "shared_expert_intermediate_size": (("moe_shared_expert_intermediate_size",),
                                        "`moe_shared_expert_intermediate_size`: Nemotron-H"),
    "n_groups": (("mamba_n_groups",), "`mamba_n_groups`: older Nemotron-H files"),
    "attn_gated": (("attn_output_gate",), "`attn_output_gate`: Qwen3-Next"),
}
# ChatGLM's LM head writes padded_vocab_size logits: that key comes first.
_KEYS = tuple(
    _Key(f, ("padded_vocab_size", f) if f == "vocab_size" else (f,) + _ALIASES.get(f, ((), ""))[0],
         "`padded_vocab_size` first (ChatGLM): the LM head writes the padded width"
         if f == "vocab_size" else _ALIASES.get(f, ((), ""))[1])
    for f in _INT_FIELDS[:7] + ("attn_gated",) + _INT_FIELDS[7:] + ("mrope_interleaved",))

# The model's shape: a config without one of these is refused.
_HF_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                "intermediate_size")
# Families whose MLP is 4 x hidden_size when the config names no width.
_HF_MLP_4H = ("gpt2", "bloom", "falcon", "RefinedWeb", "RefinedWebModel")
_PATTERN = {"M": "linear_attention", "*": "full_attention", "E": "moe", "-": "mlp"}
# Nemotron-H's layers_block_type names, as transformers remaps them.
_BLOCK_TYPES = {"mamba": "linear_attention", "attention": "full_attention", "mlp": "mlp",
                "moe": "moe"}


class _Ctx:
    """What a rule may look at: the config's keys (text_config first), the
    family, and where the config came from (for messages)."""

    __slots__ = ("lookup", "model_type", "where")

    def __init__(self, lookup, model_type, where):
        self.lookup, self.model_type, self.where = lookup, model_type, where

    def int(self, key):
        found, v = self.lookup(key)
        if not found:
            return None
        if type(v) is bool or not isinstance(v, int):
            raise TypeError(f"{self.where}: config key {key!r} must be a JSON integer, "
                            f"got {type(v).__name__}")
        return v


def _rule_mla_head_dim(out, ctx):
    nope = ctx.int("qk_nope_head_dim")
    if nope is not None:
        out["head_dim"] = max(nope + (ctx.int("qk_rope_head_dim") or 0),
                              ctx.int("v_head_dim") or 0)


def _rule_mlp_4h(out, ctx):
    if "intermediate_size" not in out and ctx.model_type in _HF_MLP_4H and "hidden_size" in out:
        out["intermediate_size"] = 4 * out["hidden_size"]


def _rule_kv_heads(out, ctx):
    if "num_key_value_heads" in out:
        return
    if ctx.lookup("multi_query")[1] is True:
        out["num_key_value_heads"] = 1
    elif ctx.lookup("multi_query_attention")[1] is True and \
            ctx.int("multi_query_group_num") is not None:
        out["num_key_value_heads"] = ctx.int("multi_query_group_num")
    elif "num_attention_heads" in out:
        out["num_key_value_heads"] = out["num_attention_heads"]


def _rule_head_dim(out, ctx):
    heads = out.get("num_attention_heads", 0)
    if "head_dim" not in out and "hidden_size" in out:
        out["head_dim"] = out["hidden_size"] // heads if heads else 0


def _rule_moe_width(out, ctx):
    if "moe_intermediate_size" not in out and out.get("num_experts", 0) > 0 \
            and "intermediate_size" in out:
        out["moe_intermediate_size"] = out["intermediate_size"]


def _rule_shared_width(out, ctx):
    n = ctx.int("n_shared_experts")
    if "shared_expert_intermediate_size" not in out and n is not None:
        out["shared_expert_intermediate_size"] = n * out.get("moe_intermediate_size", 0)


def _rule_gated(out, ctx):
    out.setdefault("attn_gated", ctx.model_type == "qwen3_next")


def _rule_layer_types(out, ctx):
    where = ctx.where
    found, lt = ctx.lookup("layer_types")
    if found:
        if not isinstance(lt, list) or not all(isinstance(x, str) for x in lt):
            raise TypeError(f"{where}: config key 'layer_types' must be a JSON list of strings")
        out["layer_types"] = tuple(lt)
        return
    found, bt = ctx.lookup("layers_block_type")
    if found:
        if not isinstance(bt, list) or not all(isinstance(x, str) for x in bt):
            raise TypeError(f"{where}: config key 'layers_block_type' must be a JSON list of "
                            "strings")
        out["layer_types"] = tuple(_BLOCK_TYPES.get(x, x) for x in bt)
        return
    found, pat = ctx.lookup("hybrid_override_pattern")
    if found:
        if not isinstance(pat, str):
            raise TypeError(f"{where}: config key 'hybrid_override_pattern' must be a string")
        try:
            out["layer_types"] = tuple(_PATTERN[ch] for ch in pat)
        except KeyError as e:
            raise ValueError(f"{where}: hybrid_override_pattern has an unknown layer code "
                             f"{e.args[0]!r}") from None


def _rule_mrope(out, ctx):
    if out.get("mrope_interleaved"):
        return
    for key in ("rope_scaling", "rope_parameters"):
        rope = ctx.lookup(key)[1]
        if isinstance(rope, dict) and (rope.get("mrope_section") is not None
                                       or rope.get("mrope_interleaved") is True):
            out["mrope_interleaved"] = True
            return


def _rule_quantization(out, ctx):
    found, qc = ctx.lookup("quantization_config")
    if found:
        out["quantization"] = _quantization(qc, ctx.where)


# In the order they apply; each sets its field only where the keys did not.
_RULES = (
    _Rule("head_dim", ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"),
          "MLA (DeepSeek-V2, V3, GLM-4.7-Flash): `max(qk_nope_head_dim + qk_rope_head_dim, "
          "v_head_dim)`, in place of any `head_dim` key (GLM-4.7-Flash's `head_dim` is its "
          "rope width). The query and key heads are `qk_nope_head_dim + qk_rope_head_dim` "
          "wide and the value head `v_head_dim`; the formulas have one head width D, so D "
          "is the wider of the two and every buffer sized from D holds what the narrower "
          "head writes (DeepSeek-V3: D = 192, values 128). The latent widths are "
          "`kv_lora_rank`, `q_lora_rank` and `qk_rope_head_dim`, read as they are.",
          _rule_mla_head_dim),
    _Rule("intermediate_size", (),
          "GPT-2, BLOOM and Falcon without a width: `4 * hidden_size`.", _rule_mlp_4h),
    _Rule("num_key_value_heads", ("multi_query", "multi_query_attention",
                                  "multi_query_group_num"),
          "Absent: 1 when `multi_query` is true (Falcon-7B); `multi_query_group_num` when "
          "`multi_query_attention` is true (ChatGLM); else `num_attention_heads`.",
          _rule_kv_heads),
    _Rule("head_dim", (), "Absent: `hidden_size // num_attention_heads` (0 without heads).",
          _rule_head_dim),
    _Rule("moe_intermediate_size", (),
          "Absent in a MoE config (`num_experts` > 0): `intermediate_size`. Mixtral, "
          "gpt-oss and their kind have no separate expert width: every expert is an "
          "`intermediate_size`-wide MLP, and `expert_gate_out` / `expert_up_out` hold the "
          "k experts of each token, `k * intermediate_size` wide.", _rule_moe_width),
    _Rule("shared_expert_intermediate_size", ("n_shared_experts",),
          "Absent: `n_shared_experts * moe_intermediate_size` (DeepSeek, GLM-4.5, "
          "GLM-4.7-Flash): the shared experts run as one MLP that wide.", _rule_shared_width),
    _Rule("attn_gated", (), "Absent: true for `qwen3_next`, whose q projection also writes "
          "the output gate.", _rule_gated),
    _Rule("layer_types", ("layer_types", "layers_block_type", "hybrid_override_pattern"),
          "`layer_types` as given (gpt-oss, Qwen3-Next); else `layers_block_type` "
          "(Nemotron-H: `mamba` is `linear_attention`, `attention` is `full_attention`); else "
          "`hybrid_override_pattern`, one letter a layer: `M` SSM (`linear_attention`), `*` "
          "attention, `E` MoE, `-` MLP.", _rule_layer_types),
    _Rule("mrope_interleaved", ("rope_scaling", "rope_parameters"),
          "True when `rope_scaling` (or `rope_parameters`) holds an `mrope_section` or "
          "`mrope_interleaved: true` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): three position "
          "streams, which the prefill metadata in `scratch` holds.", _rule_mrope),
    _Rule("quantization", ("quantization_config",),
          "`quantization_config`'s `quant_method`; `\"fp8-rowwise\"` for FP8 weights with "
          "one scale per output row (docs/levers.md).", _rule_quantization),
)

_IGNORED = (
    _Ignored(("max_position_embeddings", "n_positions", "n_ctx", "seq_length",
              "max_sequence_length", "initial_context_length", "model_max_length"),
             "the context length: the KV cache and the block tables are sized by "
             "`max_seq_len`, a serving limit"),
    _Ignored(("sliding_window", "sliding_window_pattern", "max_window_layers",
              "sliding_window_size"),
             "which keys attention reads: a mask over the KV cache, which is not an arena "
             "buffer"),
    _Ignored(("first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step", "mlp_only_layers"),
             "which layers are dense: a dense layer's MLP is `intermediate_size` wide, which "
             "is read, and `expert_gate_out` / `expert_up_out` take the wider of it and "
             "`k * moe_intermediate_size`"),
    _Ignored(("n_group", "topk_group"),
             "grouped routing: it picks among the `num_experts` scores already sized"),
    _Ignored(("num_nextn_predict_layers", "mtp_layers_block_type", "mtp_hybrid_override_pattern"),
             "multi-token-prediction layers have a decoder layer's shapes; per-pass buffers "
             "are reused layer after layer"),
    _Ignored(("ep_size", "pretraining_tp"),
             "how the checkpoint was trained in parallel; per-rank sizing is `tp_size`"),
    _Ignored(("chunk_size", "mamba_chunk_size"),
             "the SSD scan's chunk length is the kernel's choice (64 in the reference), and "
             "the result does not depend on it"),
    _Ignored(("conv_kernel", "linear_conv_kernel_dim", "mamba_d_conv"),
             "the causal convolution's window: its state lives in the per-sequence cache and "
             "its output is as wide as its input"),
    _Ignored(("expand", "mamba_expand"),
             "Mamba-2's inner width is `mamba_num_heads * mamba_head_dim`, which is read"),
    _Ignored(("qk_head_dim",),
             "MLA's query/key head, `qk_nope_head_dim + qk_rope_head_dim`, which are read"),
    _Ignored(("num_logits_to_keep", "logits_to_keep"),
             "logits rows are sized by the verify and decode limits (docs/buffers.md#logits)"),
    _Ignored(("query_pre_attn_scalar", "rope_theta", "rotary_dim", "rotary_emb_base",
              "rope_ratio"),
             "a scale or rotary parameter, not a width"),
    _Ignored(("mm_tokens_per_image",),
             "the vision tower and its tokens are not part of the language model's pass"),
    _Ignored(("*_token_id", "*_token_ids", "*_token_index", "image_token_index"), "a token id"),
    _Ignored(("max_length", "min_length", "num_beams", "num_beam_groups", "top_k",
              "num_return_sequences", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
              "chunk_size_feed_forward"),
             "generation and training defaults every transformers config carries"),
)

# A key not read and not ignored is reported when its value is an integer (or
# a list of integers) and its name has one of these words, or starts with
# num_ / n_: the spellings of model dimensions in published configs.
_SHAPE_WORDS = frozenset((
    "size", "dim", "dims", "head", "heads", "expert", "experts", "rank", "layer", "layers",
    "group", "groups", "width", "channels", "inner", "embd", "embed", "hidden",
    "intermediate", "vocab", "latent", "state", "mult", "kv", "ffn", "mlp", "moe", "topk",
    "chunk", "conv", "kernel", "window", "block", "blocks", "proj", "lora", "tokens",
))


def _quantization(qc, where):
    """ModelConfig.quantization from a config's quantization_config: the
    quant_method, or 'fp8-rowwise' for FP8 weights with one scale per output
    row (the checkpoints METRALE_FP8_ROWWISE serves)."""
    if not isinstance(qc, dict):
        raise TypeError(f"{where}: config key 'quantization_config' must be a JSON object")
    method = qc.get("quant_method")
    if not isinstance(method, str) or not method:
        raise ValueError(f"{where}: quantization_config has no 'quant_method' string")
    if method == "fbgemm_fp8":
        return "fp8-rowwise"
    if method == "compressed-tensors":
        groups = qc.get("config_groups")
        weights = [g.get("weights") for g in groups.values() if isinstance(g, dict)] \
            if isinstance(groups, dict) else []
        if weights and all(isinstance(w, dict) and w.get("type") == "float"
                           and w.get("num_bits") == 8 and w.get("strategy") == "channel"
                           for w in weights):
            return "fp8-rowwise"
    return method
