"""ModelConfig: the model shape the arena is sized from.

A frozen value with one field per model dimension the buffer sizes read, the
bundled presets, and the mapping from a Hugging Face ``config.json``.
"""

import os

from ._common import check_index
from ._record import Record

__all__ = ["ModelConfig"]

# The documented field order: the dense shape and attention, then the GDN,
# MoE, Mamba-2, MLA, grouped-O, hyper-connection, QSA indexer and LoRA fields.
_INT_FIELDS = (
    "hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim",
    "full_attention_interval",
    "linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads",
    "linear_value_head_dim", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size", "shared_expert_intermediate_size", "zero_expert_num",
    "moe_latent_size", "mamba_num_heads", "mamba_head_dim", "ssm_state_size",
    "n_groups", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "o_groups",
    "o_lora_rank", "hc_mult", "hc_lowrank", "index_n_heads", "index_head_dim",
    "index_topk", "index_compress_ratio", "adapter_max_rank",
)
_BOOL_FIELDS = ("attn_gated", "mrope_interleaved")
FIELDS = _INT_FIELDS[:7] + ("attn_gated",) + _INT_FIELDS[7:8] + ("layer_types",) + \
    _INT_FIELDS[8:] + ("mrope_interleaved", "model_type", "quantization")

_DEFAULTS = dict.fromkeys(_INT_FIELDS, 0)
_DEFAULTS.update(num_experts_per_tok=1, attn_gated=False, mrope_interleaved=False,
                 model_type="", layer_types=(), quantization="")


class ModelConfig:
    """A frozen, hashable model shape: every dimension the buffer sizes read.

    Built from keyword fields; every field not given keeps its default (0 for
    the integer fields except ``num_experts_per_tok``, which is 1; False for
    the flags; ``""`` for the strings; ``()`` for ``layer_types``).  Usually
    made by `preset` or `from_hf_config`.  Instances compare and hash by value
    (they serve as dict keys), pickle, and refuse assignment: `replace` makes a
    changed copy.

    Parameters
    ----------
    **fields
        Any of the attributes below, by name.

    Attributes
    ----------
    hidden_size : int
        Model width (H).
    intermediate_size : int
        Dense FFN width (I).
    vocab_size : int
        Vocabulary size (V).
    num_hidden_layers : int
        Number of layers.
    num_attention_heads : int
        Query heads (Hq).
    num_key_value_heads : int
        KV heads (Hkv).
    head_dim : int
        Attention head dimension (D).
    attn_gated : bool
        The q projection also writes an output gate (doubles its width).
    full_attention_interval : int
        Every n-th layer is full attention, the others SSM (0: all layers
        are attention).  Ignored when `layer_types` is given.
    layer_types : tuple of str
        Kind of each layer; SSM layers (GDN or Mamba-2) are
        ``"linear_attention"``.  Empty when the model does not list them.
    linear_num_key_heads : int
        GDN (gated delta net) key heads.
    linear_key_head_dim : int
        GDN key head dimension.
    linear_num_value_heads : int
        GDN value heads.
    linear_value_head_dim : int
        GDN value head dimension.
    num_experts : int
        Routed experts (0: a dense model).
    num_experts_per_tok : int
        Routed experts per token, the router's top-k (default 1).
    moe_intermediate_size : int
        FFN width of a routed expert.
    shared_expert_intermediate_size : int
        FFN width of the shared expert.
    zero_expert_num : int
        Zero (identity) experts the router also scores.
    moe_latent_size : int
        Latent width of a LatentMoE model (0: experts read the hidden state).
    mamba_num_heads : int
        Mamba-2 heads.
    mamba_head_dim : int
        Mamba-2 head dimension.
    ssm_state_size : int
        Mamba-2 state size.
    n_groups : int
        Mamba-2 groups.
    kv_lora_rank : int
        MLA KV latent rank; > 0 marks an MLA model.
    q_lora_rank : int
        MLA query latent rank.
    qk_rope_head_dim : int
        MLA rotary head dimension.
    o_groups : int
        Groups of the grouped low-rank O projection.
    o_lora_rank : int
        Rank of the grouped low-rank O projection.
    hc_mult : int
        Hyper-connection streams (0: none).
    hc_lowrank : int
        Rank of the low-rank hyper-connection mixing (0: none).
    index_n_heads : int
        Heads of the sparse-attention (QSA) indexer.
    index_head_dim : int
        Head dimension of the QSA indexer.
    index_topk : int
        Tokens the QSA indexer selects.
    index_compress_ratio : int
        KV compression ratio of the QSA indexer (0: no QSA selection).
    adapter_max_rank : int
        Largest LoRA rank served (0: no adapters, no LoRA buffers).
    mrope_interleaved : bool
        Three position streams (temporal, height, width) instead of one.
    model_type : str
        The model family (Hugging Face ``model_type``); informational, no
        size depends on it.
    quantization : str
        The checkpoint's ``quantization_config`` quant method (``""`` when
        unquantized), or ``"fp8-rowwise"`` for FP8 weights with one scale per
        output row.  ``"fp8-rowwise"`` turns the METRALE_FP8_ROWWISE lever on
        when that variable is not set.

    Raises
    ------
    TypeError
        An unknown field; an integer field that is not an int (bool
        included); a flag that is not a bool; `model_type` or `quantization`
        not a str; `layer_types` not an iterable of str (a single string is
        refused).
    ValueError
        An integer field that is negative or does not fit 64 bits.

    Examples
    --------
    >>> cfg = ModelConfig.preset("qwen3-next-80b")
    >>> cfg.replace(num_experts=256).num_experts
    256
    """

    __slots__ = FIELDS + ("_key", "_hash")

    def __init__(self, **fields):
        for name in fields:
            if name not in _DEFAULTS:
                raise TypeError(f"ModelConfig() got an unexpected field {name!r}")
        values = dict(_DEFAULTS)
        values.update(fields)
        for name in _INT_FIELDS:
            values[name] = check_index(values[name], f"ModelConfig field {name!r}")
        for name in _BOOL_FIELDS:
            if not isinstance(values[name], bool):
                raise TypeError(f"ModelConfig field {name!r} must be a bool, got {type(values[name]).__name__}")
        for name in ("model_type", "quantization"):
            if not isinstance(values[name], str):
                raise TypeError(f"ModelConfig field {name!r} must be a str, "
                                f"got {type(values[name]).__name__}")
        lt = values["layer_types"]
        if isinstance(lt, (str, bytes)):
            raise TypeError("ModelConfig field 'layer_types' must be an iterable of str, not a single string")
        try:
            lt = tuple(lt)
        except TypeError:
            raise TypeError("ModelConfig field 'layer_types' must be an iterable of str") from None
        if not all(isinstance(x, str) for x in lt):
            raise TypeError("ModelConfig field 'layer_types' must hold only str")
        values["layer_types"] = lt
        for name in FIELDS:
            object.__setattr__(self, name, values[name])
        key = tuple(values[n] for n in FIELDS)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))   # configs are dict keys on hot paths

    def __setattr__(self, name, value):
        raise AttributeError("ModelConfig is frozen; use replace()")

    def __delattr__(self, name):
        raise AttributeError("ModelConfig is frozen")

    def __eq__(self, other):
        if type(other) is not ModelConfig:
            return NotImplemented
        return self is other or self._key == other._key

    def __hash__(self):
        return self._hash

    def __reduce__(self):
        return (_rebuild, (self.as_dict(),))

    def __repr__(self):
        changed = ", ".join(f"{n}={getattr(self, n)!r}" for n in FIELDS
                            if getattr(self, n) != _DEFAULTS[n])
        return f"ModelConfig({changed})"

    def as_dict(self):
        """The fields as a dict.

        Returns
        -------
        dict of str to object
            Field name -> value, for all 39 fields in their documented order.
            ``ModelConfig(**cfg.as_dict()) == cfg``.
        """
        return {n: getattr(self, n) for n in FIELDS}

    def replace(self, **changes):
        """A copy with some fields changed, like ``dataclasses.replace``.

        Parameters
        ----------
        **changes
            New values for fields, by name.

        Returns
        -------
        ModelConfig
            A new config; this one is unchanged.

        Raises
        ------
        TypeError
            A name that is not a field, or a value of the wrong type.
        ValueError
            An integer value that is negative or does not fit 64 bits.
        """
        values = self.as_dict()
        for name in changes:
            if name not in _DEFAULTS:
                raise TypeError(f"ModelConfig has no field {name!r}")
        values.update(changes)
        return ModelConfig(**values)

    # -- derived getters: the widths the size formulas use ---------------------
    def ssm_qkvz_size(self):
        """Width of the fused GDN q/k/v/z projection (QKVZ).

        Returns
        -------
        int
            ``2 * linear_num_key_heads * linear_key_head_dim
            + 2 * linear_num_value_heads * linear_value_head_dim``.
        """
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + \
            2 * self.linear_num_value_heads * self.linear_value_head_dim

    def ssm_ba_size(self):
        """Width of the GDN b/a (beta and decay) projection.

        Returns
        -------
        int
            ``2 * linear_num_value_heads``.
        """
        return 2 * self.linear_num_value_heads

    def mamba2_d_inner(self):
        """Mamba-2 inner width (d_inner).

        Returns
        -------
        int
            ``mamba_num_heads * mamba_head_dim``.
        """
        return self.mamba_num_heads * self.mamba_head_dim

    def mamba2_d_xbc(self):
        """Mamba-2 width of the x, B and C projections together (d_xbc).

        Returns
        -------
        int
            ``mamba2_d_inner() + 2 * n_groups * ssm_state_size``.
        """
        return self.mamba2_d_inner() + 2 * self.n_groups * self.ssm_state_size

    def mamba2_in_proj_size(self):
        """Mamba-2 width of the input projection (z, xBC and dt).

        Returns
        -------
        int
            ``mamba2_d_inner() + mamba2_d_xbc() + mamba_num_heads``.
        """
        return self.mamba2_d_inner() + self.mamba2_d_xbc() + self.mamba_num_heads

    def moe_input_size(self):
        """Width the routed experts read: the latent width of a LatentMoE model.

        Returns
        -------
        int
            `moe_latent_size` when > 0, else `hidden_size`.
        """
        return self.moe_latent_size if self.moe_latent_size > 0 else self.hidden_size

    def num_ssm_layers(self):
        """Number of SSM (GDN or Mamba-2) layers.

        Returns
        -------
        int
            The ``"linear_attention"`` entries of `layer_types` when it is
            not empty; otherwise every layer that is not one of each
            `full_attention_interval` (0 when the interval is 0: all layers
            are attention).
        """
        if self.layer_types:
            return sum(1 for t in self.layer_types if t == "linear_attention")
        n, interval = self.num_hidden_layers, self.full_attention_interval
        attention = n // interval if interval > 0 else n
        return n - attention

    # -- presets and Hugging Face configs ---------------------------------------
    @staticmethod
    def presets():
        """Names of the bundled model shapes.

        Returns
        -------
        tuple of str
            The names `preset` accepts: ``"qwen3-next-80b"``,
            ``"qwen3.8-27b"``, ``"glm-5.3-flash-tp2"``, ``"deepseek-v4"``,
            ``"nemotron-h"``, ``"gemma-4-dense"``, then the published
            shapes ``"llama-3.1-8b"``, ``"llama-3.1-70b"``,
            ``"qwen2.5-7b"``, ``"qwen3-30b-a3b"``, ``"mixtral-8x7b"``,
            ``"deepseek-v3"``, ``"gpt-oss-120b"`` (each equal to
            `from_hf_config` of the model's ``config.json``).
        """
        return tuple(_PRESETS)

    @staticmethod
    def preset(name):
        """One of the bundled model shapes.

        Parameters
        ----------
        name : str
            One of the names `presets` returns.

        Returns
        -------
        ModelConfig
            The shape; every field it does not set is at its default.

        Raises
        ------
        TypeError
            `name` is not a str.
        ValueError
            `name` is not a known preset; the message lists them.
        """
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        try:
            fields = _PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown preset name {name!r}; known: {', '.join(_PRESETS)}") from None
        return ModelConfig(**fields)

    @staticmethod
    def from_hf_config(path_or_dict, *, strict=False):
        """Read a Hugging Face ``config.json``.

        Every field is read from the key of its own name or from the names
        other families give it (``n_routed_experts`` and
        ``num_local_experts`` for `num_experts`, ``n_embd`` for
        `hidden_size`, ...); the first key present wins and JSON null counts
        as absent.  A nested ``text_config`` (multimodal models) is searched
        before the top level, except for ``model_type``, which comes from
        the top level.  Fields no key gives are derived by the rules of
        docs/hf-config.md, among them: MLA models (``qk_nope_head_dim``)
        get ``head_dim = max(qk_nope_head_dim + qk_rope_head_dim,
        v_head_dim)``; a MoE model without ``moe_intermediate_size``
        (Mixtral, gpt-oss) has experts ``intermediate_size`` wide;
        ``n_shared_experts`` gives a shared expert ``n_shared_experts *
        moe_intermediate_size`` wide; `num_key_value_heads` defaults to
        the attention heads and `head_dim` to hidden_size //
        num_attention_heads; `layer_types` comes from ``layer_types``,
        ``layers_block_type`` or ``hybrid_override_pattern``, M-RoPE
        (``rope_scaling.mrope_section``) sets `mrope_interleaved`, and
        `quantization` comes from ``quantization_config``.  Gemma 3's text
        configs take their transformers defaults for the keys the
        published files leave out.

        What is not understood is never dropped silently: a config key that
        looks like a model dimension (an integer named like one), is not
        read, and is not among the keys known to leave every buffer size
        unchanged, or a ``model_type`` that is not a known family (then read
        with the standard keys), is reported with a
        `metrale.errors.ConfigWarning` naming it, or refused with `strict`.
        docs/hf-config.md lists the families, keys and rules.

        Parameters
        ----------
        path_or_dict : str, os.PathLike or dict
            The path of a ``config.json``, a directory holding one, or the
            already parsed dict.
        strict : bool, optional
            Raise ValueError instead of warning (default False).

        Returns
        -------
        ModelConfig
            The model shape.

        Warns
        -----
        ConfigWarning
            One per key not understood, and one for an unknown or missing
            ``model_type``; the warning's ``key`` names the config key.

        Raises
        ------
        TypeError
            `path_or_dict` is of another type, `strict` is not a bool, or a
            config key has the wrong JSON type (an integer field that is not
            a JSON integer, a flag that is not a boolean, ``layer_types`` not
            a list of strings, ``quantization_config`` not an object); the
            message names the key.
        ValueError
            The config lacks a dimension of the model's shape (hidden_size,
            num_hidden_layers, num_attention_heads, vocab_size,
            intermediate_size, or an alias of one), the file is not UTF-8,
            malformed JSON or not a JSON object, a str holds JSON text instead
            of a path, ``hybrid_override_pattern`` has an unknown letter,
            ``quantization_config`` has no ``quant_method``, a value is
            negative or does not fit 64 bits, or, with `strict`, a key or the
            ``model_type`` is not understood (the message names them all).
        OSError
            The file cannot be read (FileNotFoundError when it does not
            exist).
        """
        if not isinstance(strict, bool):
            raise TypeError(f"strict must be a bool, got {type(strict).__name__}")
        if isinstance(path_or_dict, dict):
            data, where = path_or_dict, "path_or_dict"
        else:
            if not isinstance(path_or_dict, (str, os.PathLike)):
                raise TypeError("path_or_dict must be a path or a dict, "
                                f"got {type(path_or_dict).__name__}")
            path = os.fspath(path_or_dict)
            if not isinstance(path, str):
                raise TypeError(f"path_or_dict must be a str path, got {type(path).__name__}")
            if path.lstrip().startswith(("{", "[")):
                raise ValueError("path_or_dict is a str holding JSON text, not a path; "
                                 "pass json.loads(text) or the file's path")
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            data, where = _read_json(path), path
        fields, notes = _map_hf(data, where)
        config = ModelConfig(**fields)
        if notes:
            if strict:
                keys = ", ".join(repr(k) for k, _ in notes)
                raise ValueError(f"{where}: not understood (strict=True): {keys}; "
                                 + "; ".join(m.split(": ", 1)[1] for _, m in notes))
            import warnings
            from .errors import ConfigWarning
            for key, message in notes:
                warnings.warn(ConfigWarning(message, key), stacklevel=2)
        return config

    # -- tensor parallelism ---------------------------------------------------------
    def shard(self, tp_size):
        """The shape one rank of a tensor-parallel group holds.

        Divided the way Megatron-style engines shard (docs/tensor-parallel.md):
        attention heads, the dense, routed-expert and shared-expert MLP
        widths, the GDN and Mamba-2 heads, and the vocabulary (the LM head
        is split by vocabulary) by `tp_size`; the KV heads and the Mamba-2
        groups by `tp_size` too, with a floor of one: when there are fewer
        than `tp_size`, each rank holds one replica, and they must then
        divide `tp_size`.  Everything else (the model width, head
        dimensions, expert count and top-k, the MLA latent ranks, the
        indexer, the hyper-connections, the LoRA rank) is the same on every
        rank.

        Parameters
        ----------
        tp_size : int
            Ranks in the tensor-parallel group (>= 1).

        Returns
        -------
        ModelConfig
            The per-rank shape; this config itself when `tp_size` is 1.

        Raises
        ------
        TypeError
            `tp_size` is not an int.
        ValueError
            `tp_size` is 0, negative or does not fit 64 bits, or a divided
            size is not a multiple of `tp_size` (or, for the KV heads and
            Mamba-2 groups, neither divides the other); the message names
            the field.
        """
        tp = check_index(tp_size, "tp_size", 1)
        if tp == 1:
            return self
        changes = {}
        for name, how in _TP_SPLIT:
            v = getattr(self, name)
            if how == "split":
                if v % tp:
                    raise ValueError(f"cannot shard {name} = {v} over tp_size = {tp}: "
                                     f"{v} is not a multiple of {tp}")
                changes[name] = v // tp
            elif how == "split_or_replicate" and v:
                if v >= tp and v % tp == 0:
                    changes[name] = v // tp
                elif v < tp and tp % v == 0:
                    changes[name] = 1
                else:
                    raise ValueError(f"cannot shard {name} = {v} over tp_size = {tp}: "
                                     "neither divides the other")
        return self.replace(**changes)


def _read_json(path):
    import json
    with open(path, "rb") as f:
        raw = f.read()
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except ValueError as e:    # JSONDecodeError, or an int past the digit limit
        raise ValueError(f"{path}: malformed JSON: {e}") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply to read") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a config.json must hold a JSON object, got {type(data).__name__}")
    return data


def _rebuild(fields):
    return ModelConfig(**fields)


# -- Hugging Face config.json: what is read, written once ---------------------------
#
# Four tables say everything from_hf_config does, and docs/hf-config.md is
# generated from them (tools/gen_docs.py): the families it knows (with the
# defaults of their transformers config class for keys a published file leaves
# out), the config keys each field is read from, the rules that derive a field
# no key gives, and the keys known not to change any per-pass buffer size.  Any
# other key whose name and value look like a model dimension is reported
# (ConfigWarning, or ValueError with strict=True), never silently dropped.

class _Family(Record):
    """A family of configs: its ``model_type`` values, its name in the docs,
    and the shape defaults its transformers config class gives keys that the
    published files leave out."""

    __slots__ = ("model_types", "name", "defaults")


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
    _Family(("gemma3", "gemma3_text"), "Gemma 3", _GEMMA3_TEXT_DEFAULTS),
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


def _looks_like_a_dimension(key, value):
    if type(value) is bool:
        return False
    if not isinstance(value, int) and not (
            isinstance(value, list) and value and all(type(x) is int for x in value)):
        return False
    words = key.lower().split("_")
    return words[0] in ("num", "n") or not _SHAPE_WORDS.isdisjoint(words)


def _consumed():
    """Every config key some field or rule reads."""
    keys = {"model_type", "text_config"}
    for k in _KEYS:
        keys.update(k.keys)
    for r in _RULES:
        keys.update(r.reads)
    return frozenset(keys)


_CONSUMED = _consumed()


def _ignored(key):
    from fnmatch import fnmatchcase
    for row in _IGNORED:
        for pattern in row.keys:
            if pattern == key or ("*" in pattern and fnmatchcase(key, pattern)):
                return True
    return False


def _map_hf(data, where):
    """The fields of a parsed config.json, and the notes on what was not
    understood: (key, message) pairs."""
    text = data.get("text_config")
    text = text if isinstance(text, dict) else {}

    def lookup(key):
        for src in (text, data):
            v = src.get(key)
            if v is not None:     # JSON null counts as absent
                return True, v
        return False, None

    out = {}
    mt = data.get("model_type")
    out["model_type"] = mt if isinstance(mt, str) else ""
    tmt = text.get("model_type")
    family = tmt if isinstance(tmt, str) and tmt else out["model_type"]
    for row in _KEYS:
        for key in row.keys:
            found, v = lookup(key)
            if found:
                if row.field in _BOOL_FIELDS:
                    if not isinstance(v, bool):
                        raise TypeError(f"{where}: config key {key!r} must be a JSON boolean")
                elif type(v) is bool or not isinstance(v, int):
                    raise TypeError(f"{where}: config key {key!r} must be a JSON integer, "
                                    f"got {type(v).__name__}")
                out[row.field] = v
                break
    fam = _FAMILY_OF.get(family)
    if fam is not None:
        for name, v in fam.defaults.items():
            out.setdefault(name, v)
    ctx = _Ctx(lookup, out["model_type"], where)
    for rule in _RULES:
        rule.apply(out, ctx)
    for name in _HF_REQUIRED:
        if name not in out:
            keys = next(k.keys for k in _KEYS if k.field == name)
            keys = tuple(k for k in keys if k != name)
            also = f" (or {', '.join(keys)})" if keys else ""
            raise ValueError(f"{where}: the config has no {name!r}{also}: it does not give "
                             "the model's shape")
    notes = []
    if fam is None:
        what = f"model_type {family!r} is not a family metrale knows" if family else \
            "the config has no model_type"
        notes.append(("model_type", f"{where}: {what}; it was read with the standard keys "
                      "(docs/hf-config.md), so check the sizes"))
    for src in (data, text) if text else (data,):
        for key, value in src.items():
            if key in _CONSUMED or _ignored(key) or not _looks_like_a_dimension(key, value):
                continue
            notes.append((key, f"{where}: config key {key!r} = {value!r} looks like a model "
                          "dimension, but metrale does not read it: the buffer sizes may be "
                          "too small for this model (docs/hf-config.md)"))
    return out, notes


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


# -- tensor parallelism: how each rank is sized, written once ------------------------
#
# (fields, how, why): "split" divides by tp_size and refuses a remainder;
# "split_or_replicate" divides, or keeps one replica per rank when there are
# fewer than tp_size (which they must then divide); "whole" keeps the field.
# ModelConfig.shard applies it; docs/tensor-parallel.md shows it (generated).
_TP_RULES = (
    (("num_attention_heads",), "split",
     "the q projection is column-parallel: each rank computes its share of the query heads"),
    (("num_key_value_heads",), "split_or_replicate",
     "the k and v projections are column-parallel too; with fewer KV heads than ranks each "
     "rank holds one head, replicated"),
    (("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"), "split",
     "gate and up are column-parallel and down row-parallel, in the dense MLP and in every "
     "expert (tensor parallelism splits each expert; expert parallelism is not modelled)"),
    (("vocab_size",), "split",
     "the LM head is vocabulary-parallel: each rank writes the logits of its share of the "
     "vocabulary (an engine that gathers whole logits into `logits` must size it for the "
     "whole vocabulary)"),
    (("linear_num_key_heads", "linear_num_value_heads"), "split",
     "GDN heads are split like attention heads"),
    (("mamba_num_heads",), "split", "Mamba-2 heads are split like attention heads"),
    (("n_groups",), "split_or_replicate",
     "Mamba-2's B/C groups follow its heads; with fewer groups than ranks each rank holds "
     "one, replicated"),
    (("hidden_size", "num_hidden_layers", "moe_latent_size"), "whole",
     "the residual stream is whole on every rank (row-parallel outputs are all-reduced)"),
    (("head_dim", "qk_rope_head_dim", "linear_key_head_dim", "linear_value_head_dim",
      "mamba_head_dim", "ssm_state_size"), "whole", "a head is never split"),
    (("num_experts", "num_experts_per_tok", "zero_expert_num"), "whole",
     "every rank routes every token over all the experts"),
    (("kv_lora_rank", "q_lora_rank"), "whole", "MLA's latent projections are replicated"),
    (("index_n_heads", "index_head_dim", "index_topk", "index_compress_ratio", "o_groups",
      "o_lora_rank", "hc_mult", "hc_lowrank", "adapter_max_rank"), "whole",
     "replicated in the engines that serve them, and kept whole either way: an upper bound "
     "of a split one"),
)
_TP_SPLIT = tuple((f, how) for fields, how, _ in _TP_RULES if how != "whole" for f in fields)


_NEMOTRON_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"

_QWEN3_NEXT_80B = dict(
    model_type="qwen3_next", hidden_size=2048, num_hidden_layers=48,
    full_attention_interval=4, intermediate_size=5120, vocab_size=151936,
    num_attention_heads=16, num_key_value_heads=2, head_dim=256, attn_gated=True,
    linear_num_key_heads=16, linear_key_head_dim=128, linear_num_value_heads=32,
    linear_value_head_dim=128, num_experts=512, num_experts_per_tok=10,
    moe_intermediate_size=512, shared_expert_intermediate_size=512)

_PRESETS = {
    "qwen3-next-80b": _QWEN3_NEXT_80B,
    "qwen3.8-27b": dict(_QWEN3_NEXT_80B, hidden_size=5120, num_hidden_layers=64,
                        linear_num_value_heads=48),
    "glm-5.3-flash-tp2": dict(
        model_type="glm5_next", hidden_size=4096, num_hidden_layers=48,
        full_attention_interval=4, intermediate_size=12288, vocab_size=154880,
        num_attention_heads=32, num_key_value_heads=32, head_dim=256,
        linear_num_key_heads=32, linear_key_head_dim=128, linear_num_value_heads=32,
        linear_value_head_dim=128, num_experts=288, num_experts_per_tok=8,
        moe_intermediate_size=2048, shared_expert_intermediate_size=2048,
        kv_lora_rank=512, q_lora_rank=1536, hc_mult=4, index_n_heads=32,
        index_head_dim=128, index_topk=2048),
    "deepseek-v4": dict(
        model_type="deepseek_v4", hidden_size=4096, num_hidden_layers=43,
        vocab_size=129280, num_attention_heads=64, num_key_value_heads=1, head_dim=512,
        num_experts=256, num_experts_per_tok=6, moe_intermediate_size=2048,
        shared_expert_intermediate_size=2048, kv_lora_rank=512, q_lora_rank=1024,
        qk_rope_head_dim=64, o_lora_rank=1024, hc_mult=4, index_n_heads=64,
        index_head_dim=128, index_topk=512),
    "nemotron-h": dict(
        model_type="nemotron_h", hidden_size=2688, num_hidden_layers=52,
        layer_types=tuple(_PATTERN[c] for c in _NEMOTRON_PATTERN),
        intermediate_size=1856, vocab_size=131072, num_attention_heads=32,
        num_key_value_heads=2, head_dim=128, num_experts=128, num_experts_per_tok=6,
        moe_intermediate_size=1856, shared_expert_intermediate_size=3712,
        mamba_num_heads=64, mamba_head_dim=64, ssm_state_size=128, n_groups=8),
    "gemma-4-dense": dict(
        model_type="gemma4", hidden_size=5376, num_hidden_layers=4,
        intermediate_size=21504, vocab_size=262144, num_attention_heads=32,
        num_key_value_heads=16, head_dim=256),
    # The shapes engines load most, each equal to from_hf_config of its
    # published config.json (tests/data/hf, sources in tests/data/README.md).
    "llama-3.1-8b": dict(
        model_type="llama", hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
        vocab_size=128256, num_attention_heads=32, num_key_value_heads=8, head_dim=128),
    "llama-3.1-70b": dict(
        model_type="llama", hidden_size=8192, num_hidden_layers=80, intermediate_size=28672,
        vocab_size=128256, num_attention_heads=64, num_key_value_heads=8, head_dim=128),
    "qwen2.5-7b": dict(
        model_type="qwen2", hidden_size=3584, num_hidden_layers=28, intermediate_size=18944,
        vocab_size=152064, num_attention_heads=28, num_key_value_heads=4, head_dim=128),
    "qwen3-30b-a3b": dict(
        model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, intermediate_size=6144,
        vocab_size=151936, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768),
    "mixtral-8x7b": dict(
        model_type="mixtral", hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
        vocab_size=32000, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=14336),
    "deepseek-v3": dict(
        model_type="deepseek_v3", hidden_size=7168, num_hidden_layers=61,
        intermediate_size=18432, vocab_size=129280, num_attention_heads=128,
        num_key_value_heads=128, head_dim=192, num_experts=256, num_experts_per_tok=8,
        moe_intermediate_size=2048, shared_expert_intermediate_size=2048, kv_lora_rank=512,
        q_lora_rank=1536, qk_rope_head_dim=64, quantization="fp8"),
    "gpt-oss-120b": dict(
        model_type="gpt_oss", hidden_size=2880, num_hidden_layers=36, intermediate_size=2880,
        vocab_size=201088, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
        layer_types=("sliding_attention", "full_attention") * 18, num_experts=128,
        num_experts_per_tok=4, moe_intermediate_size=2880, quantization="mxfp4"),
}
