"""ModelConfig: the model shape the arena is sized from.

A frozen value with one field per model dimension the buffer sizes read, the
bundled presets, and the mapping from a Hugging Face ``config.json``.
"""

import os

from ._common import check_index

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
            ``"nemotron-h"``, ``"gemma-4-dense"``.
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
    def from_hf_config(path_or_dict):
        """Read a Hugging Face ``config.json``.

        A key named like a field sets that field; keys that name no field
        are ignored and JSON null counts as absent.  A nested ``text_config``
        (multimodal models) is searched before the top level, except for
        ``model_type``, which comes from the top level.  Common aliases are
        read too: ``n_routed_experts`` / ``num_local_experts`` for
        `num_experts`, ``moe_shared_expert_intermediate_size``,
        ``attn_output_gate`` for `attn_gated`, and the GPT-2, BLOOM and Falcon
        names of the shape (``n_embd``, ``n_embed``, ``n_layer``, ``n_head``,
        ``n_inner``, ``num_kv_heads``, ``ffn_hidden_size``).  When absent,
        `num_key_value_heads` is the number of attention heads, `head_dim` is
        hidden_size // num_attention_heads, `attn_gated` is True only for
        ``qwen3_next``, GPT-2 / BLOOM / Falcon get a 4 x hidden_size MLP, and
        Falcon's ``multi_query`` means one KV head.  `layer_types` comes from
        ``layer_types`` or from a Nemotron-H ``hybrid_override_pattern``
        (``M`` SSM, ``*`` attention, ``E`` MoE, ``-`` MLP), and
        `quantization` from ``quantization_config``.

        Parameters
        ----------
        path_or_dict : str, os.PathLike or dict
            The path of a ``config.json``, a directory holding one, or the
            already parsed dict.

        Returns
        -------
        ModelConfig
            The model shape.

        Raises
        ------
        TypeError
            `path_or_dict` is of another type, or a config key has the wrong
            JSON type (an integer field that is not a JSON integer, a flag
            that is not a boolean, ``layer_types`` not a list of strings,
            ``quantization_config`` not an object); the message names the key.
        ValueError
            The config lacks a dimension of the model's shape (hidden_size,
            num_hidden_layers, num_attention_heads, vocab_size,
            intermediate_size, or an alias of one), the file is not UTF-8,
            malformed JSON or not a JSON object, a str holds JSON text instead
            of a path, ``hybrid_override_pattern`` has an unknown letter,
            ``quantization_config`` has no ``quant_method``, or a value is
            negative or does not fit 64 bits.
        OSError
            The file cannot be read (FileNotFoundError when it does not
            exist).
        """
        if isinstance(path_or_dict, dict):
            return ModelConfig(**_map_hf(path_or_dict, "path_or_dict"))
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
        return ModelConfig(**_map_hf(_read_json(path), path))


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


# field <- config keys, first present wins.  Beyond the aliases of recent
# families (experts, shared expert width, output gate), the names older
# families give the model's shape: GPT-2 (n_embd, n_layer, n_head, n_inner),
# BLOOM (n_embed), Falcon (num_kv_heads, ffn_hidden_size); GPT-NeoX already
# uses the field names.
_HF_ALIASES = {
    "hidden_size": ("hidden_size", "n_embd", "n_embed"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "num_experts": ("num_experts", "n_routed_experts", "num_local_experts"),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size",
                                        "moe_shared_expert_intermediate_size"),
    "attn_gated": ("attn_gated", "attn_output_gate"),
}
# The model's shape: a config without one of these is refused.
_HF_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                "intermediate_size")
# Families whose MLP is 4 x hidden_size when the config names no width.
_HF_MLP_4H = ("gpt2", "bloom", "falcon", "RefinedWeb", "RefinedWebModel")
_PATTERN = {"M": "linear_attention", "*": "full_attention", "E": "moe", "-": "mlp"}


def _map_hf(data, where):
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
    for name in FIELDS:
        if name in ("model_type", "layer_types", "quantization"):
            continue
        for key in _HF_ALIASES.get(name, (name,)):
            found, v = lookup(key)
            if found:
                if name in _BOOL_FIELDS:
                    if not isinstance(v, bool):
                        raise TypeError(f"{where}: config key {key!r} must be a JSON boolean")
                elif type(v) is bool or not isinstance(v, int):
                    raise TypeError(f"{where}: config key {key!r} must be a JSON integer, "
                                    f"got {type(v).__name__}")
                out[name] = v
                break
    if "intermediate_size" not in out and out["model_type"] in _HF_MLP_4H and "hidden_size" in out:
        out["intermediate_size"] = 4 * out["hidden_size"]
    if "num_key_value_heads" not in out and lookup("multi_query")[1] is True:
        out["num_key_value_heads"] = 1          # Falcon's multi-query attention
    for name in _HF_REQUIRED:
        if name not in out:
            keys = _HF_ALIASES.get(name, (name,))
            also = f" (or {', '.join(keys[1:])})" if len(keys) > 1 else ""
            raise ValueError(f"{where}: the config has no {name!r}{also}: it does not give "
                             "the model's shape")
    found, lt = lookup("layer_types")
    if found:
        if not isinstance(lt, list) or not all(isinstance(x, str) for x in lt):
            raise TypeError(f"{where}: config key 'layer_types' must be a JSON list of strings")
        out["layer_types"] = tuple(lt)
    else:
        found, pat = lookup("hybrid_override_pattern")
        if found:
            if not isinstance(pat, str):
                raise TypeError(f"{where}: config key 'hybrid_override_pattern' must be a string")
            try:
                out["layer_types"] = tuple(_PATTERN[ch] for ch in pat)
            except KeyError as e:
                raise ValueError(f"{where}: hybrid_override_pattern has an unknown layer code "
                                 f"{e.args[0]!r}") from None
    found, qc = lookup("quantization_config")
    if found:
        out["quantization"] = _quantization(qc, where)
    heads = out["num_attention_heads"]
    out.setdefault("num_key_value_heads", heads)
    out.setdefault("head_dim", out["hidden_size"] // heads if heads else 0)
    out.setdefault("attn_gated", out["model_type"] == "qwen3_next")
    return out


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
}
