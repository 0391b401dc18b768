"""The formula language's vocabulary: the input symbols (`SYMBOLS`), the
derived terms (`TERMS`), the long names (`ALIASES`) and the one table of the
helpers an expression may call (`HELPER_FUNCTIONS`), which the evaluator and
the growth analysis both read.
"""

from ..._base._math import cdiv, ceil_to
from ..._base._record import Record

__all__ = ["Symbol", "Term", "SYMBOLS", "TERMS", "ALIASES", "HELPERS", "HELPER_FUNCTIONS",
           "CALLABLE", "SWITCHES", "NOT_INTEGER", "USABLE"]

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


def _s(name, meaning, fields=(), limits=(), target=(), levers=()):
    return Symbol(name, meaning, fields, limits, target, levers)


# The switch levers and the symbol each sets (the fourth lever, the split-K
# override, feeds splitk_policy / splitk_n).
SWITCHES = (
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
    _s("tp", "ranks of the tensor-parallel group the sizes are for, one rank's share each "
       "(1: the whole model)", limits=("tp_size",)),
    _s("H", "model width", ("hidden_size",)),
    _s("I", "dense FFN width", ("intermediate_size",)),
    _s("V", "vocabulary size; under tensor parallelism one rank's share of the vocabulary "
       "padded to a multiple of 64", ("vocab_size",)),
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
    Term("Vg", "V*tp", "the whole vocabulary, as a buffer the ranks' logits are gathered into "
         "holds it: vocab_size at tp 1, the vocabulary padded to a multiple of 64 at tp > 1"),
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


def _ceil(n):
    return lambda x: ceil_to(x, n)


# The helpers an engine's expressions may call, and the function each is.
# `sum` only in TERMS, over layer_types: no engine expression may call it.
HELPER_FUNCTIONS = {
    "max": max, "min": min, "cdiv": cdiv,
    "ceil4": _ceil(4), "ceil8": _ceil(8), "ceil16": _ceil(16), "ceil64": _ceil(64),
    "ceil256": _ceil(256),
}
HELPERS = tuple(HELPER_FUNCTIONS)
# What an evaluation may call: the helpers and, for TERMS, sum.
CALLABLE = dict(HELPER_FUNCTIONS, sum=sum)

# The long name of each input that stands for one config field or limit.
ALIASES = {}
for _sym in SYMBOLS:
    for _long in _sym.fields[:1] if len(_sym.fields) == 1 else ():
        if _long != _sym.name:
            ALIASES[_long] = _sym.name
    for _long in _sym.limits:
        if _long != _sym.name:
            ALIASES[_long] = _sym.name
del _sym, _long

# Symbols that are not integers (a tuple, a str): only TERMS read them.
NOT_INTEGER = frozenset({"layer_types", "splitk_policy"})
# Every name an engine's expression may read.
USABLE = frozenset(
    [s.name for s in SYMBOLS if s.name not in NOT_INTEGER] + [t.name for t in TERMS]
    + list(ALIASES) + list(HELPERS))
