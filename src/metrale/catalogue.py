"""The buffer catalogue: what each of the 46 buffers of a forward pass holds.

For every buffer (`CATALOGUE`, keyed by name in canonical order) it records
what the buffer holds, its element type and shape, its byte size in words and
as a Python expression over the symbols of `symbols`, and why it can be empty.
`metrale plan --explain NAME` prints one entry (`explain`), and
``tools/gen_docs.py`` writes ``docs/buffers.md`` and ``docs/levers.md`` from it.

The size expressions are a second implementation of the sizing, written from
the formulas rather than from ``metrale.sizes``: the test suite evaluates them
with `evaluate` and compares them with `BufferSizes.from_config`, so the
documentation cannot drift from the code.  Which helpers zero a buffer, and
which levers change it, are not recorded here but read from the code
(`membership`, `levers_of`).

Importing this module is cheap: it loads the generated buffer table and the
lever table only; the sizing modules load on first use.
"""

import re

from ._buffers import BUFFER_INDEX, BUFFER_NAMES, GROUPS
from ._record import Record
from .levers import LEVERS

__all__ = [
    "Entry", "Symbol", "Term", "Dependencies", "CATALOGUE", "SYMBOLS", "TERMS",
    "DTYPE_ITEMSIZE", "DEFAULT_LIMITS", "symbols", "evaluate", "shape_of", "dependencies",
    "membership", "levers_of", "terms_of", "explain",
]

# Element sizes of the dtype names the catalogue uses (numpy / torch spelling).
DTYPE_ITEMSIZE = {
    "bfloat16": 2, "float32": 4, "int32": 4, "uint32": 4, "int64": 8, "int8": 1,
    "float8_e4m3fn": 1,
}

# The limits `metrale plan` and the generated docs use when none are given:
# (max_batch_tokens, max_seq_len, kv_block_size, max_batch_size).
DEFAULT_LIMITS = (8192, 4096, 16, 32)


class Entry(Record):
    """One buffer of the catalogue.

    Attributes
    ----------
    name : str
        The buffer's name (as in `BufferSizes` and the arena accessors).
    holds : str
        What the buffer holds, for an engine author.
    dtype : str or None
        Element type (numpy / torch name), or None when the buffer holds mixed
        elements, raw bytes or q8_1 blocks (see `dtype_note`).
    itemsize : int or None
        Bytes per element of `shape`, or None when the shape has no element.
    dtype_note : str
        Why `dtype` is None, or what else the bytes are reused as ("" if nothing).
    shape : str
        The shape in symbols.  When `shape_exact` it is a Python list
        expression over `symbols` (e.g. ``"[M, H]"``).
    shape_exact : bool
        Whether the size is exactly max(product(shape) * itemsize, floor)
        wherever `shape_when` holds.
    shape_when : str or None
        Condition (a Python expression) under which the shape is exact; None
        means always.
    formula : str
        The byte size as a Python expression over `symbols`.
    words : str
        The byte size in words.
    floor : int or None
        The smallest size the formula gives a live buffer (256, or 65,536 for
        ``scratch``), None when there is no floor.
    families : str
        The model families that size (or empty) the buffer.
    empty : str
        Why the buffer can be 0 bytes (NULL) or a 256-byte placeholder ("" if
        it cannot for a real model).
    """

    __slots__ = ("name", "holds", "dtype", "itemsize", "dtype_note", "shape", "shape_exact",
                 "shape_when", "formula", "words", "floor", "families", "empty")


class Symbol(Record):
    """An input symbol: taken from a config field, a limit, the target or a lever.

    Attributes
    ----------
    name : str
        The symbol as the formulas write it.
    meaning : str
        What it is.
    fields : tuple of str
        The `ModelConfig` fields it is read from.
    limits : tuple of str
        The sizing arguments it is read from (``max_batch_tokens`` ...).
    target : tuple of str
        The `Target` attributes it is read from.
    levers : tuple of str
        The environment levers it is read from.
    """

    __slots__ = ("name", "meaning", "fields", "limits", "target", "levers")


class Term(Record):
    """A derived symbol or named sub-term: a Python expression over earlier ones.

    Attributes
    ----------
    name : str
        The symbol.
    expr : str
        Its definition, a Python expression over `SYMBOLS` and earlier `TERMS`.
    meaning : str
        What it is.
    """

    __slots__ = ("name", "expr", "meaning")


class Dependencies(Record):
    """What a buffer's size is read from (see `dependencies`).

    Attributes
    ----------
    fields, limits, target, levers : tuple of str
        Config fields, sizing arguments, `Target` attributes and environment
        levers that its formula reads, directly or through derived symbols.
    """

    __slots__ = ("fields", "limits", "target", "levers")


def _s(name, meaning, fields=(), limits=(), target=(), levers=()):
    return Symbol(name, meaning, fields, limits, target, levers)


# The switch levers and the symbol each sets (the fourth lever, the split-K
# override, feeds splitk_policy / splitk_n).
_SWITCHES = (
    ("METRALE_GGUF_NATIVE_Q2", "gguf_native_q2"),
    ("METRALE_GGUF_NATIVE_Q2_MMQ", "gguf_native_q2_mmq"),
    ("METRALE_FP8_ROWWISE", "fp8_rowwise"),
)
_SPLITK = "METRALE_ATTN_DECODE_SPLITK"

# Input symbols, in the order `symbols` returns them.  Field-named symbols are
# the config fields the formulas read that have no short symbol.
SYMBOLS = (
    _s("M", "most tokens one forward pass carries", limits=("max_batch_tokens",)),
    _s("max_seq_len", "longest sequence the KV cache serves", limits=("max_seq_len",)),
    _s("kv_block_size", "tokens per paged-KV block", limits=("kv_block_size",)),
    _s("max_batch_size", "most sequences one batched decode step carries",
       limits=("max_batch_size",)),
    _s("H", "model width", ("hidden_size",)),
    _s("I", "dense FFN width", ("intermediate_size",)),
    _s("V", "vocabulary size", ("vocab_size",)),
    _s("Hq", "query heads", ("num_attention_heads",)),
    _s("Hkv", "KV heads", ("num_key_value_heads",)),
    _s("D", "attention head dimension", ("head_dim",)),
    _s("attn_gated", "the q projection also writes an output gate", ("attn_gated",)),
    _s("E", "routed experts (0 = dense model)", ("num_experts",)),
    _s("k", "routed experts per token (top-k)", ("num_experts_per_tok",)),
    _s("Im", "routed expert FFN width", ("moe_intermediate_size",)),
    _s("Is", "shared expert FFN width", ("shared_expert_intermediate_size",)),
    _s("Ez", "zero experts the router scores", ("zero_expert_num",)),
    _s("Lm", "LatentMoE latent width", ("moe_latent_size",)),
    _s("nk", "GDN key heads", ("linear_num_key_heads",)),
    _s("dk", "GDN key head dimension", ("linear_key_head_dim",)),
    _s("nv", "GDN value heads", ("linear_num_value_heads",)),
    _s("dv", "GDN value head dimension", ("linear_value_head_dim",)),
    _s("Hm", "Mamba-2 heads", ("mamba_num_heads",)),
    _s("mamba_head_dim", "Mamba-2 head dimension", ("mamba_head_dim",)),
    _s("ssm_state_size", "Mamba-2 state size", ("ssm_state_size",)),
    _s("n_groups", "Mamba-2 groups", ("n_groups",)),
    _s("KVr", "MLA KV latent rank (> 0 marks an MLA model)", ("kv_lora_rank",)),
    _s("Qr", "MLA q latent rank", ("q_lora_rank",)),
    _s("r", "MLA rope head dimension", ("qk_rope_head_dim",)),
    _s("o_groups", "grouped O-projection groups", ("o_groups",)),
    _s("o_lora_rank", "grouped O-projection rank", ("o_lora_rank",)),
    _s("hc", "hyper-connection streams", ("hc_mult",)),
    _s("hr", "low-rank hyper-connection rank", ("hc_lowrank",)),
    _s("nh", "QSA indexer heads", ("index_n_heads",)),
    _s("hdi", "QSA indexer head dimension", ("index_head_dim",)),
    _s("topk", "QSA selected tokens", ("index_topk",)),
    _s("icr", "QSA compression ratio", ("index_compress_ratio",)),
    _s("rank", "largest LoRA rank served (0 = no adapters)", ("adapter_max_rank",)),
    _s("mrope_interleaved", "three position streams (T, H, W) instead of one",
       ("mrope_interleaved",)),
    _s("num_hidden_layers", "layer count", ("num_hidden_layers",)),
    _s("full_attention_interval", "every n-th layer is full attention (0 = all are)",
       ("full_attention_interval",)),
    _s("layer_types", 'per-layer kinds; an SSM layer is "linear_attention"', ("layer_types",)),
    _s("sm_count", "multiprocessors of the target device", target=("sm_count",)),
    _s("splitk_policy", "effective split-K policy, 'legacy', 'auto' or 'pinned': the "
       "target's, unless METRALE_ATTN_DECODE_SPLITK overrides it (resolve_splitk)",
       target=("splitk",), levers=(_SPLITK,)),
    _s("splitk_n", "the pinned split count (0 unless splitk_policy is 'pinned')",
       target=("splitk",), levers=(_SPLITK,)),
    _s("gguf_native_q2", "lever METRALE_GGUF_NATIVE_Q2 is on", levers=("METRALE_GGUF_NATIVE_Q2",)),
    _s("gguf_native_q2_mmq", "lever METRALE_GGUF_NATIVE_Q2_MMQ is on",
       levers=("METRALE_GGUF_NATIVE_Q2_MMQ",)),
    _s("fp8_rowwise", "lever METRALE_FP8_ROWWISE is on (set, or implied by a row-wise FP8 "
       "quantization_config when the variable is absent)", ("quantization",),
       levers=("METRALE_FP8_ROWWISE",)),
)

# Derived symbols and named sub-terms, each over the symbols and earlier terms.
TERMS = (
    Term("Mp", "ceil16(M)", "rows of every buffer a cuBLASLt block-scaled GEMM reads or writes"),
    Term("Kx", "ceil16(max(M, 3))", "rows of the expert / dense-FFN outputs"),
    Term("R", "max(32, max_batch_size)", "decode-metadata rows (DecodeMetaLayout.rows())"),
    Term("B", "256 if kv_block_size == 0 else max_seq_len // kv_block_size + 1",
         "KV blocks per sequence"),
    Term("g", "2 if attn_gated else 1", "2 when the q projection writes Q and its gate side by side"),
    Term("ps", "3 if mrope_interleaved else 1", "position streams"),
    Term("Hin", "Lm if Lm > 0 else H", "MoE input width, moe_input_size()"),
    Term("QKVZ", "2*nk*dk + 2*nv*dv", "GDN projection width, ssm_qkvz_size()"),
    Term("Vd", "nv*dv", "GDN value width"),
    Term("Di", "Hm*mamba_head_dim", "Mamba-2 d_inner, mamba2_d_inner()"),
    Term("Dx", "Di + 2*n_groups*ssm_state_size", "Mamba-2 xBC width, mamba2_d_xbc()"),
    Term("Dip", "Di + Dx + Hm", "Mamba-2 in_proj width, mamba2_in_proj_size()"),
    Term("Kf", "max(H, I)", "K width of the dense-FFN activation scratch"),
    Term("Kp", "max(H, Hq*D, Di, Vd)", "K width of the FP8 projection activation scratch"),
    Term("num_ssm_layers",
         "sum(t == 'linear_attention' for t in layer_types) if layer_types else "
         "num_hidden_layers - (num_hidden_layers // full_attention_interval "
         "if full_attention_interval > 0 else num_hidden_layers)",
         "GDN / Mamba-2 layers, num_ssm_layers()"),
    Term("Lr", "min(M, max(160, R + 1))",
         "logits rows: a 160-row speculative verify, or R decode rows plus one prefill row"),
    Term("splits", "min(max(cdiv(2*sm_count, max(Hq, 1)) if splitk_policy == 'auto' "
         "else splitk_n, 1), 16)", "split-K splits per (sequence, head) under auto / pinned"),
    Term("slots", "max(sm_count, 1) if splitk_policy == 'legacy' "
         "else max(R, 1)*max(Hq, 1)*splits", "split-K workspace slots of D + 2 floats"),
    Term("o_s", "ceil8(4*ps*M)", "prefill metadata: offset of the slot table"),
    Term("o_b", "ceil4(o_s + 8*M)", "prefill metadata: offset of the block table"),
    Term("o_l", "ceil4(o_b + 4*B)", "prefill metadata: offset of the sequence length"),
    Term("prefill_term", "8*M*k + o_l + 4",
         "scratch for prefill: top-k routing (index + weight per slot), then the metadata"),
    Term("decode_term", "32768 + max(24*160 + 160*B*4, 24*R + R*B*4)",
         "scratch for batched decode / verify: metadata at offset 32,768"),
    Term("qc", "max(cdiv(M, 8), 1)", "kernel-batched prefill: chunk per stream (8 streams)"),
    Term("qT", "8*qc", "kernel-batched prefill: tokens staged"),
    Term("q12_term", "ceil64(8*qT*k) + 8*max(16*qc + 64, 4096) + ps*ceil8(4*qT) + ceil8(8*qT) "
         "+ 2*ceil8(8*8) + ceil8(4*(8 + 1)) + ceil8(4*8) + 8*8",
         "scratch for kernel-batched prefill staging of 8 streams"),
    Term("nc", "cdiv(M, 64) + 1", "Mamba-2 SSD chunks of 64 tokens"),
    Term("X", "(cdiv(M, 64) + 16)*nv", "GDN FLA (chunk, value head) pairs, 16 spare chunks"),
    Term("moe_expanded", "M*k", "FP8 MoE: routed rows"),
    Term("moe_shared_k", "max(H, Is)", "FP8 MoE: K of the shared / gate-up phase"),
    Term("moe_act", "max(M*moe_shared_k, moe_expanded*Im)", "FP8 MoE: activation bytes"),
    Term("moe_scl", "4*max(M*cdiv(moe_shared_k, 128), moe_expanded*cdiv(Im, 128))",
         "FP8 MoE: scale bytes"),
    Term("moe_items", "(cdiv(moe_expanded, 128) + E + 1)*cdiv(max(H, Im), 64)",
         "FP8 MoE: 128 x 64 work items"),
    Term("moe_scale", "ceil256(moe_act)", "FP8 MoE: offset of the scales"),
    Term("moe_worklist", "moe_scale + ceil256(moe_scl)", "FP8 MoE: offset of the worklist"),
    Term("moe_counter", "moe_worklist + ceil256(8*moe_items)", "FP8 MoE: offset of the tile counter"),
    Term("moe_small_bytes", "E*cdiv(max(H, Im), 64)*8 if E == 256 else 0",
         "FP8 MoE: adaptive small worklist (E = 256 only)"),
    Term("moe_small_worklist", "ceil256(moe_counter + 4)", "FP8 MoE: offset of the small worklist"),
    Term("moe_small_counter", "moe_small_worklist + ceil256(moe_small_bytes)",
         "FP8 MoE: offset of the small counter"),
    Term("moe_fp8_bytes", "moe_small_counter + 4 if moe_small_bytes > 0 else moe_counter + 4",
         "FP8 MoE: slab bytes for M rows"),
)


def _cdiv(a, b):
    return -(-a // b)


def _ceil(n):
    return lambda x: -(-x // n) * n


# Everything a formula may call besides the symbols.
_HELPERS = {
    "max": max, "min": min, "sum": sum, "cdiv": _cdiv,
    "ceil4": _ceil(4), "ceil8": _ceil(8), "ceil16": _ceil(16), "ceil64": _ceil(64),
    "ceil256": _ceil(256),
}

_DENSE_NOTE = "dense models (E = 0)"


def _e(name, holds, dtype, shape, formula, words, *, itemsize=None, note="", exact=True,
       when=None, floor=None, families="every model", empty=""):
    if itemsize is None and dtype is not None:
        itemsize = DTYPE_ITEMSIZE[dtype]
    return Entry(name, holds, dtype, itemsize, note, shape, exact, when, formula, words, floor,
                 families, empty)


_FLOOR_EMPTY = ("Never 0: the 256-byte floor keeps it allocated even when none of its users "
                "exists in the model.")
_PLACEHOLDER_DENSE = ("A dense model (E = 0) gets a 256-byte placeholder that no kernel reads, "
                      "so the pointer is never NULL.")

_ENTRIES = (
    _e("hidden_states",
       "The residual-stream activations that enter and leave every layer: one BF16 row of H "
       "values per token of the pass.",
       "bfloat16", "[M, H]", "2*M*H", "M rows of H BF16 values."),
    _e("residual",
       "The running residual sum each layer adds its output to (the skip connection), kept "
       "beside hidden_states in the same [M, H] BF16 form.",
       "bfloat16", "[M, H]", "2*M*H", "M rows of H BF16 values."),
    _e("norm_output",
       "RMS-norm output, the input of the projections that follow. It is max(H, Di) wide "
       "because a Mamba-2 layer normalizes d_inner-wide rows, which can exceed the model "
       "width. norm_output_bytes() is the bound the attention-prefill o_proj cuBLASLt arm "
       "checks its ceil16(M) rows against.",
       "bfloat16", "[M, max(H, Di)]", "2*M*max(H, Di)", "M rows of max(H, Di) BF16 values.",
       families="every model; wider for Mamba-2 hybrids whose d_inner exceeds H"),
    _e("qkv_output",
       "The fused Q/K/V projection output: per token the query heads (each followed by its "
       "output gate when the attention is gated), then K, then V. It has Mp = ceil16(M) rows "
       "because the cuBLASLt prefill arm writes padded rows; qkv_output_bytes() also bounds "
       "the multi-sequence W8A8 decode arm.",
       "bfloat16", "[Mp, (g*Hq + 2*Hkv)*D]", "2*Mp*(g*Hq + 2*Hkv)*D",
       "Mp rows of g*Hq + 2*Hkv heads of D BF16 values.",
       families="every model; g = 2 for gated attention (Qwen3-Next)"),
    _e("attn_output",
       "Attention output before o_proj. Mamba-2 layers put their d_inner rows here and "
       "absorbed-MLA layers their [M, Hq, KVr + r] latent result, so it is as wide as the "
       "widest of the three.",
       "bfloat16", "[M, max(Hq*D, Di, Hq*(KVr + r) if KVr > 0 else 0)]",
       "2*M*max(Hq*D, Di, Hq*(KVr + r) if KVr > 0 else 0)",
       "M rows of BF16, as wide as the widest of Hq*D, Di and (MLA only) Hq*(KVr + r).",
       families="every model; widened by Mamba-2 (Di) and MLA (Hq*(KVr + r))"),
    _e("gate_logits",
       "BF16 router scores: per token one column per routed expert plus one per zero expert "
       "(an expert with no FFN that the router may still pick). zero_prefill_essentials clears "
       "it because stale expert indices left by an earlier request once caused out-of-bounds "
       "expert access.",
       "bfloat16", "[M, E + Ez]", "2*M*(E + Ez) if E > 0 else 256",
       "MoE: M rows of E + Ez BF16 scores; dense: a 256-byte placeholder.",
       when="E > 0", families="MoE models; a placeholder for " + _DENSE_NOTE,
       empty=_PLACEHOLDER_DENSE),
    _e("gate_logits_f32",
       "FP32 router scores for the FP32-gate path, where top-k is taken on unrounded logits. "
       "Every MoE model gets it; the lever that selects the path belongs to the engine, not "
       "to the sizing.",
       "float32", "[M, E + Ez]", "4*M*(E + Ez) if E > 0 else 256",
       "MoE: M rows of E + Ez FP32 scores; dense: a 256-byte placeholder.",
       when="E > 0", families="MoE models; a placeholder for " + _DENSE_NOTE,
       empty=_PLACEHOLDER_DENSE),
    _e("moe_router_in_f32",
       "The router's input rows widened to FP32, for the FP32-routing path where the router "
       "GEMM runs in FP32. Every MoE model gets it.",
       "float32", "[M, H]", "4*M*H if E > 0 else 256",
       "MoE: M rows of H FP32 values; dense: a 256-byte placeholder.",
       when="E > 0", families="MoE models; a placeholder for " + _DENSE_NOTE,
       empty=_PLACEHOLDER_DENSE),
    _e("moe_output",
       "Output of the MoE block, or of the dense FFN, before it joins the residual. Mp rows "
       "because the cuBLASLt dense-FFN down projection writes padded rows here.",
       "bfloat16", "[Mp, H]", "2*Mp*H", "Mp rows of H BF16 values."),
    _e("logits",
       "Output of the final vocabulary projection. It has Lr rows, not M: enough for a "
       "batched speculative verify (VERIFY_ROW_CAP = 160 rows) or a mixed decode step (R "
       "decode rows plus one prefill row), whichever is more, and never more than M.",
       "bfloat16", "[Lr, V]", "2*Lr*V", "Lr rows of V BF16 values, Lr = min(M, max(160, R + 1)).",
       families="every model (V); rows grow with max_batch_size above 159"),
    _e("ssm_qkvz",
       "Multi-use BF16 scratch sized for the largest of its users: the GDN QKVZ projection "
       "output (Mp rows, cuBLASLt arm), the Mamba-2 in_proj output [M, Dip], the prefill K and "
       "V of an attention layer (K from row 0, V from row M, the V block Mp rows tall on the "
       "cuBLASLt arm) and the MoE shared-expert up output [M, Is].",
       "bfloat16", "[Mp, QKVZ] or [M, Dip] or [M + Mp, Hkv*D] or [M, Is]",
       "max(2*Mp*QKVZ, 2*M*Dip, 2*(M + Mp)*Hkv*D, 2*M*Is, 256)",
       "The largest of its uses in BF16: Mp rows of QKVZ, M rows of Dip, M + Mp rows of "
       "Hkv*D, M rows of Is; at least 256 bytes.",
       exact=False, floor=256,
       families="every model; sized by GDN hybrids (QKVZ), Mamba-2 (Dip), attention (Hkv*D) "
                "and shared experts (Is)",
       empty=_FLOOR_EMPTY),
    _e("ssm_ba",
       "Multi-use BF16 scratch: the GDN b and a values (2*nv per token), the LatentMoE latent "
       "rows [M, Lm] and, on MLA models, the q latent [M, Qr] and later the K rope rows "
       "[M, r], one at a time.",
       "bfloat16", "[M, 2*nv] or [M, Lm] or [M, max(r, Qr)]",
       "max(4*M*nv, 2*M*Lm, 2*M*max(r, Qr) if KVr > 0 else 0, 256)",
       "The largest of, in BF16: M rows of 2*nv, M rows of Lm, (MLA) M rows of max(r, Qr); "
       "at least 256 bytes.",
       exact=False, floor=256, families="GDN hybrids, LatentMoE and MLA models; the floor "
                                        "elsewhere",
       empty="The 256-byte floor when the model has no GDN, LatentMoE or MLA layer (and "
             "whenever those uses are smaller)."),
    _e("ssm_deinterleaved",
       "Multi-use BF16 scratch: the GDN [Q|K|V|Z] rows after deinterleaving (also the QKVZ "
       "destination of models whose projection is already sequential, Mp rows), the Mamba-2 "
       "xBC rows [M, Dx], the query heads [M, Hq*D] and the absorbed-MLA query "
       "[M, Hq, KVr + r].",
       "bfloat16", "[Mp, QKVZ] or [M, Dx] or [M, Hq*D] or [M, Hq*(KVr + r)]",
       "max(2*Mp*QKVZ, 2*M*Dx, 2*M*Hq*D, 2*M*Hq*(KVr + r) if KVr > 0 else 0, 256)",
       "The largest of, in BF16: Mp rows of QKVZ, M rows of Dx, M rows of Hq*D, (MLA) M "
       "rows of Hq*(KVr + r); at least 256 bytes.",
       exact=False, floor=256, families="every model (query heads); GDN, Mamba-2 and MLA "
                                        "widen it",
       empty=_FLOOR_EMPTY),
    _e("ssm_gates",
       "FP32 GDN gates: per token nv gate values followed by nv beta values.",
       "float32", "[M, 2*nv]", "max(8*M*nv, 256)",
       "M rows of 2*nv FP32 values, at least 256 bytes.",
       floor=256, families="GDN hybrids (Qwen3-Next, GLM-5.3); the floor elsewhere",
       empty="The 256-byte floor when the model has no GDN layer (nv = 0)."),
    _e("ssm_conv_out_f32",
       "FP32 output of the GDN causal conv1d, QKVZ wide. MLA models borrow it for their BF16 "
       "query rope rows [M, Hq*r].",
       "float32", "[M, QKVZ]", "max(4*M*QKVZ, 2*M*Hq*r if KVr > 0 else 0, 256)",
       "M rows of QKVZ FP32 values, or (MLA) M rows of Hq*r BF16 values when that is more; "
       "at least 256 bytes.",
       note="MLA models write BF16 rope rows into it", when="KVr == 0", floor=256,
       families="GDN hybrids and MLA models; the floor elsewhere",
       empty="The 256-byte floor when the model has neither GDN layers nor MLA rope rows."),
    _e("scratch",
       "Byte scratch shared by users that never run at the same moment, each uploading its "
       "own layout first: the MoE top-k indices and weights followed by the prefill chunk "
       "metadata; the batched decode and speculative-verify metadata at byte offset 32,768 "
       "(DecodeMetaLayout arithmetic); and the kernel-batched prefill staging for 8 streams.",
       None, "bytes (overlapping layouts)", "max(65536, prefill_term, decode_term, q12_term)",
       "The largest of the prefill term (routing plus prefill metadata), the decode term "
       "(32 KiB plus the wider of the verify and decode metadata) and the kernel-batched "
       "prefill term; at least 64 KiB.",
       note="raw bytes: U32 / I32 / I64 metadata and the FP32 routing weights, in layouts "
            "that overlap",
       exact=False, floor=65536, empty="Never 0: at least 64 KiB."),
    _e("expert_gate_out",
       "Gate projection output of the routed top-k experts, k*Im wide per token, or I wide "
       "when a dense layer of a mixed model is wider; Kx rows. A dense model has it too: its "
       "FFN writes the gate output here (the expert buffers double as the dense FFN's), "
       "which is why it is I wide when E = 0.",
       "bfloat16", "[Kx, I if E == 0 else max(k*Im, I)]",
       "2*Kx*(I if E == 0 else max(k*Im, I))",
       "Kx rows of BF16, w wide: w = max(k*Im, I) for MoE, I for a dense model.",
       families="every model: MoE experts and the dense FFN"),
    _e("expert_up_out",
       "Up projection output, the partner of expert_gate_out: the same shape in a separate "
       "buffer, because the activation reads gate and up together. Dense models use it for "
       "the dense FFN's up projection.",
       "bfloat16", "[Kx, I if E == 0 else max(k*Im, I)]",
       "2*Kx*(I if E == 0 else max(k*Im, I))",
       "The same as expert_gate_out: Kx rows of max(k*Im, I) (MoE) or I (dense) BF16 values.",
       families="every model: MoE experts and the dense FFN"),
    _e("expert_down_out",
       "Down projection output of the top-k experts, one Hin-wide slice per routed expert "
       "(Hin is the LatentMoE latent width when the model has one, else H), or the dense "
       "FFN's H-wide output.",
       "bfloat16", "[Kx, H if E == 0 else k*Hin]", "2*Kx*H if E == 0 else 2*Kx*k*Hin",
       "Kx rows of BF16: k*Hin wide for MoE, H wide for a dense model.",
       families="every model: MoE experts (LatentMoE narrows Hin) and the dense FFN"),
    _e("splitk_workspace",
       "Partial results of the split-K paged-decode attention: one slot per (sequence, "
       "q-head, split) holding D partial outputs, the running max and the running sum. Sized "
       "for R, the widest batch the decode metadata accepts, with the policy resolver the "
       "launch uses: a short workspace would be a silent out-of-bounds write.",
       "float32", "[slots, D + 2]", "4*(D + 2)*slots",
       "slots of D + 2 FP32 values; slots = sm_count under the legacy policy, else "
       "R*Hq*splits.",
       families="every model; the policy comes from the target and METRALE_ATTN_DECODE_SPLITK"),
    _e("o_latent",
       "Latent output of the grouped O projection: o_groups groups of rank o_lora_rank per "
       "token. No helper zeroes it and total_bytes() leaves it out, as the reference "
       "preflight does.",
       "bfloat16", "[M, o_groups*o_lora_rank]", "max(2*M*o_groups*o_lora_rank, 256)",
       "M rows of o_groups*o_lora_rank BF16 values, at least 256 bytes.",
       floor=256, families="models with a grouped O projection; the floor elsewhere",
       empty="The 256-byte floor when the model has no grouped O projection (o_groups or "
             "o_lora_rank is 0)."),
    _e("norm_unit_w",
       "An all-zero BF16 weight row. The RMS-norm kernel scales by (1 + w), so passing this "
       "weight gives a plain normalization. Zero-filled once at construction; no helper "
       "touches it again, and total_bytes() leaves it out.",
       "bfloat16", "[max(H, Di)]", "2*max(H, Di)", "max(H, Di) BF16 values."),
    _e("hc_streams",
       "Hyper-connection residual streams: hc parallel FP32 copies of the hidden row per "
       "token.",
       "float32", "[M, hc, H]", "4*M*hc*H if hc > 0 else 256",
       "hc > 0: M rows of hc*H FP32 values; else a 256-byte placeholder.",
       when="hc > 0", families="hyper-connection models (DeepSeek-V4, GLM-5.3)",
       empty="A 256-byte placeholder when the model has no hyper-connections (hc = 0)."),
    _e("hc_post",
       "Hyper-connection post weights: hc FP32 values per token that spread a layer's output "
       "over the streams.",
       "float32", "[M, hc]", "max(4*M*hc, 256) if hc > 0 else 256",
       "hc > 0: M rows of hc FP32 values, at least 256 bytes; else a 256-byte placeholder.",
       when="hc > 0", floor=256, families="hyper-connection models (DeepSeek-V4, GLM-5.3)",
       empty="A 256-byte placeholder when hc = 0."),
    _e("hc_comb",
       "Hyper-connection combination matrix: hc x hc FP32 values per token that mix the "
       "streams.",
       "float32", "[M, hc, hc]", "max(4*M*hc*hc, 256) if hc > 0 else 256",
       "hc > 0: M rows of hc*hc FP32 values, at least 256 bytes; else a 256-byte placeholder.",
       when="hc > 0", floor=256, families="hyper-connection models (DeepSeek-V4, GLM-5.3)",
       empty="A 256-byte placeholder when hc = 0."),
    _e("hc_lowrank_scratch",
       "Scratch of the low-rank hyper-connection kernels, one layout at a time: up to 64 "
       "tokens (decode) FP32 normed [64, hc*H] then low [64, hr]; longer passes, in slabs of "
       "Ts = min(M, 2048) tokens, BF16 normed and up_pre [Ts, hc*H], low [Ts, hr] and "
       "inj_pre [Ts, hc] back to back.",
       None, "two layouts (see holds)",
       "max(4*min(M, 64)*(hc*H + hr), 2*min(M, 2048)*(2*hc*H + hr + hc)) "
       "if hc > 0 and hr > 0 else 256",
       "hc > 0 and hr > 0: the larger of the decode layout (4 bytes x min(M, 64) rows x "
       "(hc*H + hr)) and the prefill layout (2 bytes x min(M, 2048) rows x (2*hc*H + hr + "
       "hc)); else a 256-byte placeholder.",
       note="FP32 in the decode layout, BF16 in the prefill layout", exact=False,
       families="low-rank hyper-connection models (hc_lowrank > 0)",
       empty="A 256-byte placeholder unless the model has low-rank hyper-connections "
             "(hc > 0 and hr > 0); no bundled preset sets hc_lowrank."),
    _e("qsa_select_scratch",
       "QSA indexer prefill token-selection scratch, shared by every indexer layer (single "
       "stream): 2,048 rows of BF16 qk [(nh + 1)*hdi], FP32 q_post [nh*hdi], FP32 scores "
       "[ceil(max_seq_len/icr)] and I32 selected-token lists [topk // icr], back to back.",
       None, "four regions of 2048 rows (see holds)",
       "2048*(2*(nh + 1)*hdi + 4*nh*hdi + 4*cdiv(max_seq_len, icr) + 4*(topk // icr)) "
       "if topk > 0 and icr > 0 else 256",
       "topk > 0 and icr > 0: 2,048 rows of 2*(nh + 1)*hdi + 4*nh*hdi + "
       "4*ceil(max_seq_len/icr) + 4*(topk // icr) bytes; else a 256-byte placeholder.",
       note="BF16 qk, FP32 q_post and scores, I32 lists", exact=False,
       families="QSA-indexer models with a compression ratio (index_topk and "
                "index_compress_ratio > 0)",
       empty="A 256-byte placeholder unless topk > 0 and icr > 0. The DeepSeek-V4 and "
             "GLM-5.3 presets set index_topk but leave index_compress_ratio at 0, so they "
             "get the placeholder."),
    _e("ssd_scratch",
       "Mamba-2 SSD chunked-scan scratch over 64-token chunks: FP32 dt and dA_cumsum "
       "[Hm, nc, 64] and the chunk matrices CB [nc, G, 64, 64], G = max(n_groups, 1).",
       "float32", "[Hm, nc, 64] x 2, then [nc, max(n_groups, 1), 64, 64]",
       "2*(Hm*nc*64*4) + nc*max(n_groups, 1)*64*64*4 if Hm > 0 and ssm_state_size > 0 else 0",
       "Mamba-2: two FP32 [Hm, nc, 64] arrays plus FP32 [nc, G, 64, 64], nc = ceil(M/64) + 1; "
       "else 0.",
       exact=False, families="Mamba-2 hybrids (Nemotron-H)",
       empty="0 bytes and NULL without Mamba-2 layers (Hm = 0 or ssm_state_size = 0)."),
    _e("gdn_fla_scratch",
       "GDN FLA chunked-prefill scratch over 64-token chunks, with 16 spare chunks for the "
       "batched FLA path (one per stream, up to 16 streams): BF16 W, U, S and uc regions and "
       "FP32 gc, for X (chunk, value head) pairs.",
       None, "five regions (see holds)",
       "2*X*64*dk + 2*X*64*dv + 2*X*dk*dv + 2*X*64*dv + 4*X*64 "
       "if nv > 0 and dk == 128 and dv == 128 else 0",
       "GDN with dk = dv = 128: BF16 W [X, 64, dk], U [X, 64, dv], S [X, dk, dv], uc "
       "[X, 64, dv] and FP32 gc [X, 64], X = (ceil(M/64) + 16)*nv; else 0.",
       note="BF16 W / U / S / uc, FP32 gc", exact=False,
       families="GDN hybrids with 128-wide key and value heads (Qwen3-Next, GLM-5.3)",
       empty="0 bytes and NULL without GDN layers, or when the GDN heads are not 128 wide "
             "(the FLA kernels are built for dk = dv = 128 only)."),
    _e("token_ids",
       "U32 token ids of the pass, read by hash-routed MoE layers (token id to expert "
       "lookup). The engine uploads them before the layer loop, and before each replay of a "
       "captured decode graph.",
       "uint32", "[M]", "max(4*M, 256)", "M U32 ids, at least 256 bytes.", floor=256),
    _e("ffn_act_q8",
       "q8_1-quantized activations of the dense FFN's Q4_K MMQ path: M rows of ceil256(Kf) "
       "values at 4 bytes each, plus 1 MiB of slack.",
       None, "[M, ceil256(Kf)] at 4 bytes, + 1 MiB",
       "4*M*ceil256(Kf) + 1048576 if E == 0 else 0",
       "Dense: 4 bytes x M rows x ceil256(Kf), plus 1 MiB; MoE: 0.",
       note="q8_1 blocks (int8 values with a per-block scale and sum), sized at 4 bytes per "
            "value plus slack",
       exact=False, families=_DENSE_NOTE,
       empty="0 bytes and NULL for MoE models: only the dense FFN quantizes its activations "
             "here."),
    _e("ffn_act_a",
       "Quantized dense-FFN activations: int8 [Mp, Kf]. The NVFP4 path packs [M, Kf/2] and "
       "the FP8 path [M, Kf] into the same bytes.",
       "int8", "[Mp, Kf]", "Mp*Kf if E == 0 else 0", "Dense: Mp rows of Kf bytes; MoE: 0.",
       note="also NVFP4 packed [M, Kf/2] or FP8 [M, Kf]", when="E == 0",
       families=_DENSE_NOTE, empty="0 bytes and NULL for MoE models."),
    _e("ffn_act_scale",
       "Activation scales of the dense FFN: one 4-byte word per 32 values, [Mp, Kf // 32] "
       "(floor division, as the reference engine). The NVFP4 [M, Kf/16] and FP8 "
       "[M, Kf/128] scales use the same bytes.",
       None, "[Mp, Kf // 32]", "4*Mp*(Kf // 32) if E == 0 else 0",
       "Dense: Mp rows of Kf // 32 four-byte scales (floor division); MoE: 0.",
       itemsize=4, note="4-byte scale words, also reused for the NVFP4 and FP8 scales",
       when="E == 0", families=_DENSE_NOTE, empty="0 bytes and NULL for MoE models."),
    _e("ffn_act_scale_kmajor",
       "The dense FFN's FP8 activation scales transposed to token-contiguous order, "
       "[Kf // 128, Mp], as the cuBLASLt block-scaled FFN GEMM reads them.",
       "float32", "[Kf // 128, Mp]", "4*Mp*(Kf // 128) if E == 0 else 0",
       "Dense: Kf // 128 rows of Mp FP32 scales (floor division); MoE: 0.",
       when="E == 0", families=_DENSE_NOTE, empty="0 bytes and NULL for MoE models."),
    _e("ffn_gate_up_fused",
       "BF16 output of the fused dense gate+up decode GEMM for up to GATEUP_FUSED_MAX_M = 16 "
       "rows; a row is [gate, up] with up at column I. A buffer of its own because widening "
       "expert_gate_out for this decode band would cost M rows; sized for every dense model, "
       "whether or not the fused arm runs.",
       "bfloat16", "[16, 2*I]", "2*16*2*I if E == 0 else 0",
       "Dense: 16 rows of 2*I BF16 values (64*I bytes); MoE: 0.",
       when="E == 0", families=_DENSE_NOTE, empty="0 bytes and NULL for MoE models."),
    _e("fp8_act",
       "FP8 (E4M3) activations of the prefill projections, Kp wide: the widest K among the "
       "hidden-input projections (q/k/v, GDN qkvz), o_proj (Hq*D), the Mamba-2 out_proj "
       "(Di) and the GDN out_proj (Vd).",
       "float8_e4m3fn", "[Mp, Kp]", "Mp*Kp", "Mp rows of Kp FP8 bytes."),
    _e("moe_fp8_scratch",
       "One slab reused in turn by every grouped FP8 MoE layer: FP8 activations, FP32 "
       "scales, the 128 x 64 tile worklist and its counter, and an adaptive small worklist "
       "when E = 256. It has no pointer accessor: arena.moe_fp8_scratch(config, rows) gives "
       "the region addresses.",
       None, "slab of 256-aligned regions", "moe_fp8_bytes if E > 0 else 0",
       "MoE: the FP8 MoE layout for M rows (activations, scales, worklist and counter, each "
       "256-aligned, plus the small worklist when E = 256); dense: 0.",
       note="FP8 activations, FP32 scales, 8-byte work items and 4-byte counters",
       exact=False, families="MoE models",
       empty="0 bytes and NULL for " + _DENSE_NOTE + ": there are no grouped experts."),
    _e("fp8_act_scale",
       "FP32 scales of fp8_act, one per 128 activations (ceiling division, so a ragged last "
       "block has its scale).",
       "float32", "[Mp, cdiv(Kp, 128)]", "4*Mp*cdiv(Kp, 128)",
       "Mp rows of ceil(Kp/128) FP32 scales."),
    _e("fp8_act_scale_kmajor",
       "The transpose of fp8_act_scale (token-contiguous) for cuBLASLt. A separate buffer "
       "because the transpose is written while the source is still live.",
       "float32", "[cdiv(Kp, 128), Mp]", "4*Mp*cdiv(Kp, 128)",
       "ceil(Kp/128) rows of Mp FP32 scales."),
    _e("q2_dequant_scratch",
       "BF16 staging into which each keep-packed GGUF Q2_0 projection is dequantized in turn: "
       "large enough for the biggest projection that has H as one dimension. Independent of "
       "M.",
       "bfloat16", "[H, max(I, QKVZ, Dip, g*Hq*D, 2*Hkv*D)]",
       "2*H*max(I, QKVZ, Dip, g*Hq*D, 2*Hkv*D) if gguf_native_q2 else 0",
       "Lever on: H x max(I, QKVZ, Dip, g*Hq*D, 2*Hkv*D) BF16 values; else 0.",
       when="gguf_native_q2", families="every model, when the lever is on",
       empty="0 bytes and NULL unless METRALE_GGUF_NATIVE_Q2 is exactly \"1\"."),
    _e("lora_xa",
       "LoRA shrink output x*A^T: rank values per token.",
       "bfloat16", "[M, rank]", "2*M*rank if rank > 0 else 0",
       "With adapters: M rows of rank BF16 values; else 0.",
       when="rank > 0", families="any model served with LoRA adapters (adapter_max_rank > 0)",
       empty="0 bytes and NULL without adapters (rank = 0)."),
    _e("lora_delta",
       "LoRA expand output, the low-rank update added to a projection's output: as wide as "
       "the widest target projection.",
       "bfloat16", "[M, max(H, I, g*Hq*D)]", "2*M*max(H, I, g*Hq*D) if rank > 0 else 0",
       "With adapters: M rows of max(H, I, g*Hq*D) BF16 values; else 0.",
       when="rank > 0", families="any model served with LoRA adapters (adapter_max_rank > 0)",
       empty="0 bytes and NULL without adapters (rank = 0)."),
    _e("lora_hact",
       "LoRA hidden activation [M, I] for adapters on the dense FFN.",
       "bfloat16", "[M, I]", "2*M*I if rank > 0 else 0",
       "With adapters: M rows of I BF16 values; else 0.",
       when="rank > 0", families="any model served with LoRA adapters (adapter_max_rank > 0)",
       empty="0 bytes and NULL without adapters (rank = 0), and also with adapters when the "
             "model has no dense FFN (I = 0, e.g. DeepSeek-V4)."),
    _e("lora_seq_slot",
       "Adapter slot of each prefill token. A buffer of its own so that it can never overlap "
       "the metadata regions of scratch.",
       "int32", "[M]", "4*M if rank > 0 else 0", "With adapters: M I32 values; else 0.",
       when="rank > 0", families="any model served with LoRA adapters (adapter_max_rank > 0)",
       empty="0 bytes and NULL without adapters (rank = 0)."),
    _e("q2_act_q8",
       "q8_1 activations of the keep-packed Q2_0 MMQ prefill: the ffn_act_q8 rule with "
       "K = max(H, I, Hq*D).",
       None, "[M, ceil256(max(H, I, Hq*D))] at 4 bytes, + 1 MiB",
       "4*M*ceil256(max(H, I, Hq*D)) + 1048576 if gguf_native_q2_mmq else 0",
       "Lever on: 4 bytes x M rows x ceil256(max(H, I, Hq*D)), plus 1 MiB; else 0.",
       note="q8_1 blocks, sized at 4 bytes per value plus slack", exact=False,
       families="every model, when the lever is on",
       empty="0 bytes and NULL unless METRALE_GGUF_NATIVE_Q2_MMQ is exactly \"1\"."),
    _e("ssm_rowwise_w_bf16",
       "Slab for the BF16 copies of each GDN layer's in_proj_qkvz [QKVZ, H] and out_proj "
       "[H, Vd] weights under the row-wise FP8 prefill, made on the layer's first prefill and "
       "kept for the arena's life. It has no pointer accessor: carve it with "
       "arena.take_ssm_rowwise_w_bf16(bytes).",
       "bfloat16", "num_ssm_layers x ([QKVZ, H] + [H, Vd])",
       "num_ssm_layers*(2*QKVZ*H + 2*H*Vd) if fp8_rowwise else 0",
       "Lever on: num_ssm_layers x (BF16 [QKVZ, H] + BF16 [H, Vd]); else 0.",
       exact=False, families="GDN hybrids with row-wise FP8 weights",
       empty="0 bytes and NULL unless METRALE_FP8_ROWWISE is on (the variable is exactly "
             "\"1\", or absent with a row-wise FP8 quantization_config), and also when the "
             "model has no SSM layer or QKVZ and Vd are 0."),
)

CATALOGUE = {e.name: e for e in _ENTRIES}

_SYMBOL_BY_NAME = {s.name: s for s in SYMBOLS}
_TERM_BY_NAME = {t.name: t for t in TERMS}
_code_cache = {}


def _code(expr):
    # Compiled once per expression: the tests evaluate every formula many times.
    code = _code_cache.get(expr)
    if code is None:
        code = _code_cache[expr] = compile(expr, "<catalogue>", "eval")
    return code


def _eval(expr, namespace):
    return eval(_code(expr), namespace)


def _names(expr):
    """Every name an expression reads, including those inside comprehensions."""
    out, todo = set(), [_code(expr)]
    while todo:
        code = todo.pop()
        out.update(code.co_names)
        todo.extend(c for c in code.co_consts if hasattr(c, "co_names"))
    return out


def symbols(config, max_batch_tokens, max_seq_len, kv_block_size, max_batch_size,
            target=None, env=None):
    """The value of every symbol the catalogue's formulas use.

    The input symbols (`SYMBOLS`) are read from the config fields, the limits,
    the target and the levers; the derived ones (`TERMS`) are evaluated from
    their documented expressions, in order.

    Parameters
    ----------
    config : ModelConfig
        The model shape.
    max_batch_tokens, max_seq_len, kv_block_size, max_batch_size : int
        The serving limits, as for `BufferSizes.from_config`.
    target : Target, optional
        The device sized for; None means ``Target.reference()``.
    env : mapping, optional
        Where the levers are read; None means ``os.environ``.

    Returns
    -------
    dict
        Symbol name -> value (int, bool, str, or the tuple ``layer_types``),
        inputs first, then the derived symbols in `TERMS` order.

    Raises
    ------
    TypeError
        If `config` is not a ModelConfig, `target` not a Target, `env` not a
        mapping, or a limit not an int.
    ValueError
        If a limit is negative or `max_batch_tokens` is 0.
    """
    from .levers import lever_on
    from .sizes import resolve_splitk, sizing_inputs

    M, max_seq_len, kv_block_size, max_batch_size, target, env = sizing_inputs(
        config, max_batch_tokens, max_seq_len, kv_block_size, max_batch_size, target, env)
    c = config
    policy, pinned = resolve_splitk(target, env)
    v = {"M": M, "max_seq_len": max_seq_len, "kv_block_size": kv_block_size,
         "max_batch_size": max_batch_size}
    for s in SYMBOLS:
        if len(s.fields) == 1 and not s.levers:
            v[s.name] = getattr(c, s.fields[0])
    v["sm_count"] = target.sm_count
    v["splitk_policy"], v["splitk_n"] = policy, pinned
    for lever, name in _SWITCHES:
        v[name] = lever_on(lever, env, c)      # the one lever rule
    namespace = dict(_HELPERS)
    namespace["__builtins__"] = {}
    namespace.update(v)
    for t in TERMS:
        namespace[t.name] = v[t.name] = _eval(t.expr, namespace)
    return v


def evaluate(name, values):
    """Evaluate one buffer's documented formula.

    Parameters
    ----------
    name : str
        A buffer name.
    values : dict
        Symbol values, as `symbols` returns them.

    Returns
    -------
    int
        The buffer's size in bytes by the catalogue's formula.

    Raises
    ------
    ValueError
        If `name` is not a buffer.
    """
    entry = _entry(name)
    namespace = dict(_HELPERS)
    namespace["__builtins__"] = {}
    namespace.update(values)
    return _eval(entry.formula, namespace)


def shape_of(name, values):
    """One buffer's shape at the given symbol values, where it is exact.

    Parameters
    ----------
    name : str
        A buffer name.
    values : dict
        Symbol values, as `symbols` returns them.

    Returns
    -------
    tuple of int or None
        The shape (its product times `Entry.itemsize` is the buffer's size,
        or less where a floor applies); None where the catalogue has no
        element type or no exact shape for these values (`shape_exact`,
        `shape_when`).

    Raises
    ------
    ValueError
        If `name` is not a buffer.
    """
    entry = _entry(name)
    if entry.dtype is None or not entry.shape_exact:
        return None
    namespace = dict(_HELPERS)
    namespace["__builtins__"] = {}
    namespace.update(values)
    if entry.shape_when is not None and not _eval(entry.shape_when, namespace):
        return None
    return tuple(int(d) for d in _eval(entry.shape, namespace))


def _entry(name):
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    entry = CATALOGUE.get(name)
    if entry is None:
        import difflib
        near = difflib.get_close_matches(name, BUFFER_NAMES, 3)
        hint = f"; did you mean {', '.join(near)}?" if near else \
            f"; the {len(BUFFER_NAMES)} buffers are listed by `metrale plan`"
        raise ValueError(f"no buffer named {name!r}{hint}")
    return entry


def _terms_used(expr):
    """The derived symbols an expression reads, directly or through other
    derived symbols, in `TERMS` order."""
    seen, todo = set(), [expr]
    while todo:
        for n in _names(todo.pop()):
            if n in _TERM_BY_NAME and n not in seen:
                seen.add(n)
                todo.append(_TERM_BY_NAME[n].expr)
    return tuple(t.name for t in TERMS if t.name in seen)


def terms_of(name):
    """The derived symbols a buffer's formula reads, directly or indirectly.

    Parameters
    ----------
    name : str
        A buffer name.

    Returns
    -------
    tuple of str
        Names from `TERMS`, in `TERMS` order.

    Raises
    ------
    ValueError
        If `name` is not a buffer.
    """
    return _terms_used(_entry(name).formula)


def dependencies(name):
    """What a buffer's size is read from, found by reading its formula.

    Parameters
    ----------
    name : str
        A buffer name.

    Returns
    -------
    Dependencies
        The config fields, limits, target attributes and levers its formula
        reads, directly or through derived symbols, in `SYMBOLS` order.

    Raises
    ------
    ValueError
        If `name` is not a buffer.
    """
    entry = _entry(name)
    exprs = [entry.formula] + [_TERM_BY_NAME[t].expr for t in _terms_used(entry.formula)]
    read = set()
    for e in exprs:
        read |= _names(e)
    parts = {"fields": [], "limits": [], "target": [], "levers": []}
    for s in SYMBOLS:
        if s.name in read:
            for key in parts:
                for x in getattr(s, key):
                    if x not in parts[key]:
                        parts[key].append(x)
    return Dependencies(**{k: tuple(x) for k, x in parts.items()})


def membership(name):
    """Which helpers cover a buffer, read from the buffer table (src/buffers.h).

    Parameters
    ----------
    name : str
        A buffer name.

    Returns
    -------
    dict
        ``zero_all`` (bool), ``zero_all_rows`` (``"trimmed"``, ``"whole"`` or
        None), ``zero_prefill_essentials`` (bool), ``checksum`` (bool),
        ``total`` (bool: counted by ``total_bytes()``), ``pointer`` and
        ``bytes`` (bool: the arena has ``arena.<name>()`` /
        ``arena.<name>_bytes()``).

    Raises
    ------
    ValueError
        If `name` is not a buffer.
    """
    _entry(name)
    z = name in GROUPS["zero_all"]
    return {
        "zero_all": z,
        # zero_all_rows covers the zero_all buffers: trims the token-major ones,
        # clears the rest whole.
        "zero_all_rows": ("trimmed" if name in GROUPS["rows"] else "whole") if z else None,
        "zero_prefill_essentials": name in GROUPS["prefill"],
        "checksum": name in GROUPS["checksum"],
        "total": name in GROUPS["total"],
        "pointer": name in GROUPS["pointer"],
        "bytes": name in GROUPS["bytes"],
    }


def levers_of(name):
    """The environment levers that change a buffer's size (from `metrale.levers`).

    Parameters
    ----------
    name : str
        A buffer name.

    Returns
    -------
    tuple of str
        Lever names, in `metrale.levers.LEVERS` order.

    Raises
    ------
    ValueError
        If `name` is not a buffer.
    """
    _entry(name)
    return tuple(lv.name for lv in LEVERS if name in lv.buffers)


_NAME = re.compile(r"[A-Za-z_]\w*")


def _substitute(expr, values):
    # Shows a formula with the numbers put in: ints, bools and strs only
    # (layer_types stays a name).
    def put(m):
        x = values.get(m.group(0), _NAME)
        if x is _NAME or not isinstance(x, (int, str)):
            return m.group(0)
        return repr(x)
    return _NAME.sub(put, expr)


def _wrap(label, text, width=88):
    import textwrap
    pad = " " * 16
    return textwrap.fill(text, width, initial_indent=f"  {label:<14}", subsequent_indent=pad,
                         break_on_hyphens=False)


def explain(name, sizes=None, config=None, *, max_batch_tokens=None, max_seq_len=None,
            kv_block_size=None, max_batch_size=None, target=None, env=None):
    """The catalogue entry of one buffer, as text (``metrale plan --explain NAME``).

    Parameters
    ----------
    name : str
        A buffer name.
    sizes : BufferSizes, optional
        Sizes to report the buffer's actual byte count from.
    config : ModelConfig, optional
        A model: the formula is then also shown evaluated, with its symbols'
        values, for the limits below.
    max_batch_tokens, max_seq_len, kv_block_size, max_batch_size : int, optional
        The limits the formula is evaluated for; each defaults to its value in
        `DEFAULT_LIMITS` (8192, 4096, 16, 32), as ``metrale plan`` does.
    target : Target, optional
        The device sized for; None means ``Target.reference()``.
    env : mapping, optional
        Where the levers are read; None means ``os.environ``.

    Returns
    -------
    str
        Several lines, ending with a newline.

    Raises
    ------
    ValueError
        If `name` is not a buffer (the message names it), or a limit is out
        of range.
    TypeError
        If `name` is not a str, `sizes` not a BufferSizes or `config` not a
        ModelConfig.
    """
    e = _entry(name)
    if sizes is not None:
        from .sizes import BufferSizes
        if not isinstance(sizes, BufferSizes):
            raise TypeError(f"sizes must be a BufferSizes or None, got {type(sizes).__name__}")
    i = BUFFER_INDEX[name]
    lines = [f"{name}  (buffer {i + 1} of {len(BUFFER_NAMES)}; docs/buffers.md#{name})"]
    add = lines.append
    add(_wrap("holds:", e.holds))
    element = e.dtype if e.dtype else (f"{e.itemsize}-byte words" if e.itemsize else "mixed")
    add(_wrap("element:", element + (f" ({e.dtype_note})" if e.dtype_note else "")))
    add(_wrap("shape:", e.shape + (f"  (when {e.shape_when})" if e.shape_when else "")))
    add(_wrap("size:", e.words))
    add(_wrap("formula:", e.formula))
    used = _terms_used(e.formula)
    for j, t in enumerate(used):
        add(_wrap("" if j else "where:", f"{t} = {_TERM_BY_NAME[t].expr}"))
    m = membership(name)
    zeroed = [h for h, on in (("zero_all", m["zero_all"]),
                              (f"zero_all_rows ({m['zero_all_rows']})", m["zero_all_rows"]),
                              ("zero_prefill_essentials", m["zero_prefill_essentials"])) if on]
    add(_wrap("zeroed by:", ", ".join(zeroed) or "never (no helper writes it)"))
    add(_wrap("checksum:", "probed by debug_buffer_checksum" if m["checksum"] else "not probed"))
    add(_wrap("total_bytes:", "counted" if m["total"] else "not counted"))
    acc = [f"arena.{name}()" if m["pointer"] else "", f"arena.{name}_bytes()" if m["bytes"] else ""]
    add(_wrap("accessors:", ", ".join(a for a in acc if a) or "none"))
    d = dependencies(name)
    add(_wrap("levers:", ", ".join(levers_of(name)) or "none"))
    add(_wrap("config:", ", ".join(d.fields) or "none"))
    add(_wrap("families:", e.families))
    add(_wrap("can be empty:", e.empty or "no, not for a real model"))
    if config is not None:
        from .sizes import BufferSizes
        dflt = DEFAULT_LIMITS
        lim = tuple(dflt[j] if x is None else x for j, x in enumerate(
            (max_batch_tokens, max_seq_len, kv_block_size, max_batch_size)))
        values = symbols(config, *lim, target=target, env=env)
        got = evaluate(name, values)
        add(f"  evaluated for max_batch_tokens={lim[0]} max_seq_len={lim[1]} "
            f"kv_block_size={lim[2]} max_batch_size={lim[3]}:")
        for t in used:
            add(_wrap("", f"{t} = {_substitute(_TERM_BY_NAME[t].expr, values)} = {values[t]:,}"
                      if not isinstance(values[t], bool) else f"{t} = {values[t]}"))
        add(_wrap("", f"{_substitute(e.formula, values)} = {got:,} bytes"))
        if sizes is None:
            sizes = BufferSizes.from_config(config, *lim, target=target, env=env)
            add(_wrap("from_config:", f"{getattr(sizes, name):,} bytes"))
        else:
            actual = getattr(sizes, name)
            add(_wrap("in sizes:", f"{actual:,} bytes" + (
                "" if actual == got else "  (differs: the sizes were built for other limits, "
                "target or levers, or replaced)")))
    elif sizes is not None:
        add(_wrap("in sizes:", f"{getattr(sizes, name):,} bytes"))
    return "\n".join(lines) + "\n"
