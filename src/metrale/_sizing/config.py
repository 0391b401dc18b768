"""ModelConfig: the model shape the arena is sized from.

A frozen value with one field per model dimension the buffer sizes read, and
how a tensor-parallel rank's shape is divided.  The field names are in
`metrale._base._fields`, the mapping from a Hugging Face ``config.json`` in
`metrale._sizing._hf`, the bundled shapes in `metrale._sizing._presets`.
"""

from .._base._common import check_index
from .._base._fields import _BOOL_FIELDS, _DEFAULTS, _INT_FIELDS, FIELDS
from ._hf import read_hf, report_hf
from ._presets import PRESETS

__all__ = ["ModelConfig"]

# Tensor parallelism pads the vocabulary to a multiple of this before dividing
# it (vLLM and SGLang: DEFAULT_VOCAB_PADDING_SIZE, pad_vocab_size in
# model_executor/layers/vocab_parallel_embedding.py; docs/tensor-parallel.md).
VOCAB_PADDING = 64


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
        return tuple(PRESETS)

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
            fields = PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown preset name {name!r}; known: {', '.join(PRESETS)}") from None
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
        configs take their transformers defaults (``Gemma3TextConfig``)
        for the keys the published files leave out; each default taken but
        ``vocab_size``'s is reported, naming the key and the value.

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
            One per key not understood, one for an unknown or missing
            ``model_type``, and one per shape key a family default stood in
            for; the warning's ``key`` names the config key.  Each message
            starts with the file's path (``DIR/config.json`` for a
            directory), or ``config dict`` for a dict.

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
        fields, notes, where = read_hf(path_or_dict)
        config = ModelConfig(**fields)
        if notes:
            report_hf(notes, where, strict)
        return config

    # -- tensor parallelism ---------------------------------------------------------
    def shard(self, tp_size):
        """The shape one rank of a tensor-parallel group holds.

        Divided the way Megatron-style engines shard (docs/tensor-parallel.md):
        attention heads, the dense, routed-expert and shared-expert MLP
        widths, the GDN and Mamba-2 heads by `tp_size`; the vocabulary (the
        LM head is split by vocabulary) is first padded to a multiple of 64,
        as vLLM's and SGLang's ``VocabParallelEmbedding`` pad it, then
        divided (GPT-2's 50,257 is 50,304 padded: 25,152 per rank at
        `tp_size` 2); the KV heads and the Mamba-2 groups by `tp_size` too,
        with a floor of one: when there are fewer than `tp_size`, each rank
        holds one replica, and they must then divide `tp_size`.  Everything
        else (the model width, head dimensions, expert count and top-k, the
        MLA latent ranks, the indexer, the hyper-connections, the LoRA rank)
        is the same on every rank.

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
            size is not a multiple of `tp_size` (the vocabulary once padded
            to a multiple of 64; for the KV heads and Mamba-2 groups,
            neither divides the other); the message names the field.
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
            elif how == "split_padded":
                padded = -(-v // VOCAB_PADDING) * VOCAB_PADDING
                if padded % tp:
                    raise ValueError(f"cannot shard {name} = {v} over tp_size = {tp}: padded to "
                                     f"a multiple of {VOCAB_PADDING} it is {padded}, which is not "
                                     f"a multiple of {tp}")
                changes[name] = padded // tp
            elif how == "split_or_replicate" and v:
                if v >= tp and v % tp == 0:
                    changes[name] = v // tp
                elif v < tp and tp % v == 0:
                    changes[name] = 1
                else:
                    raise ValueError(f"cannot shard {name} = {v} over tp_size = {tp}: "
                                     "neither divides the other")
        return self.replace(**changes)


def _rebuild(fields):
    return ModelConfig(**fields)


_TP_RULES = (
    (("num_attention_heads",), "split",
     "the q projection is column-parallel: each rank computes its share of the query heads"),
    (("num_key_value_heads",), "split_or_replicate",
     "the k and v projections are column-parallel too; with fewer KV heads than ranks each "
     "rank holds one head, replicated"),
    (("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"), "split",
     "gate and up are column-parallel and down row-parallel, in the dense MLP and in every "
     "expert (tensor parallelism splits each expert; expert parallelism is not modelled)"),
    (("vocab_size",), "split_padded",
     "the LM head is vocabulary-parallel: each rank writes the logits of its share of the "
     "vocabulary, padded as vLLM and SGLang pad it (`pad_vocab_size(vocab, 64)`, then "
     "divided); a buffer the shares are gathered into holds `Vg` = `V * tp` columns, the "
     "whole padded vocabulary"),
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
