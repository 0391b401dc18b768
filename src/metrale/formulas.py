"""The formula language of buffer sizes: symbols, derived terms, helpers.

Every buffer's size (`metrale.buffers.BufferSpec`) is a Python expression over
the symbols below: inputs read from the model config, the serving limits, the
target device and the environment levers (`SYMBOLS`), and derived symbols
defined by documented expressions over them (`TERMS`).  Each input that
stands for one config field or limit can also be written by that name
(``max_batch_tokens`` for ``M``, ``hidden_size`` for ``H``: `ALIASES`).

An engine's own expressions (a spec's size, shape or condition) are checked
by `check` before anything is evaluated: integer arithmetic (``+ - * // %``),
comparisons, ``and`` / ``or`` / ``not``, ``a if c else b`` and calls of the
helpers ``max``, ``min`` (of two or more), ``cdiv`` and ``ceil4`` ...
``ceil256`` over the integer symbols, brackets nested at most 100 deep.
Nothing else (no attribute, no subscript, no power, no string), so
evaluating one runs no code but that arithmetic and always ends.

Pure Python; the sizing (`metrale.sizes`) evaluates a whole set at once.
"""

import ast
import keyword

from ._record import Record

__all__ = ["Symbol", "Term", "SYMBOLS", "TERMS", "ALIASES", "HELPERS", "check", "names_of",
           "values", "namespace"]


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


# Everything an expression may call besides the symbols (`sum` only in TERMS,
# over layer_types).
_HELPERS = {
    "max": max, "min": min, "sum": sum, "cdiv": _cdiv,
    "ceil4": _ceil(4), "ceil8": _ceil(8), "ceil16": _ceil(16), "ceil64": _ceil(64),
    "ceil256": _ceil(256),
}
# The helpers an engine's expressions may call.
HELPERS = ("max", "min", "cdiv", "ceil4", "ceil8", "ceil16", "ceil64", "ceil256")

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
_NOT_INTEGER = frozenset({"layer_types", "splitk_policy"})
# Every name an engine's expression may read.
_USABLE = frozenset(
    [s.name for s in SYMBOLS if s.name not in _NOT_INTEGER] + [t.name for t in TERMS]
    + list(ALIASES) + list(HELPERS))

_MAX_EXPR = 2000            # characters of one expression
# Brackets one expression may nest: the sizing compiles a set's formulas into
# one expression, a shape's dimension a few brackets deeper than it is written,
# and CPython's parser stops at 200 (an expression that parsed alone then
# failed there with a SyntaxError).
_MAX_DEPTH = 100
_U64 = 1 << 64
_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)
_UNARY = (ast.USub, ast.UAdd, ast.Not)
_COMPARE = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_code_cache = {}
_tree_cache = {}


def check(expr, where):
    """Check an engine's expression and return the names it reads.

    Parameters
    ----------
    expr : str
        A Python expression in the language above.
    where : str
        What the expression is, for the messages (``"buffer spec 'x': size"``).

    Returns
    -------
    frozenset of str
        The symbols, terms and aliases it reads.

    Raises
    ------
    TypeError
        `expr` is not a str.
    ValueError
        It is empty, too long, not an expression, uses something outside the
        language, or reads an unknown name (the message names it and where).
    """
    if not isinstance(expr, str):
        raise TypeError(f"{where} must be a str expression, got {type(expr).__name__}")
    if not expr.strip():
        raise ValueError(f"{where} is empty")
    if len(expr) > _MAX_EXPR:
        raise ValueError(f"{where} is longer than {_MAX_EXPR} characters")
    if not expr.isascii():      # Python would fold a name's other letters into another's
        raise ValueError(f"{where}: {expr!r} is not ASCII (names are the ASCII symbols of "
                         "docs/buffers.md)")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ValueError(f"{where}: {expr!r} is not an expression ({e})") from None
    read = set()
    # A helper is a function: named anywhere but as what a call calls, it is
    # no size (and used to fail only at sizing, with a TypeError naming nothing).
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        bad = _bad_node(node)
        if bad:
            raise ValueError(f"{where}: {expr!r}: {bad}")
        if isinstance(node, ast.Name) and node.id in HELPERS and id(node) not in called:
            raise ValueError(f"{where}: {expr!r}: {node.id} is a helper: call it, "
                             f"{node.id}(...)")
        if isinstance(node, ast.Name):
            if node.id not in _USABLE:
                raise ValueError(f"{where}: unknown name {node.id!r} in {expr!r}; "
                                 "names are the symbols of docs/buffers.md (M, H, ...), "
                                 "their long names (max_batch_tokens, hidden_size, ...) "
                                 "and the helpers " + ", ".join(HELPERS))
            if node.id not in HELPERS:
                read.add(node.id)
    if "#" in expr:         # no string constant got here: a '#' starts a comment
        raise ValueError(f"{where}: {expr!r}: a comment (#) is not part of the language")
    depth = most = 0
    for c in expr:          # no string constant got here: every bracket is one
        depth += (c in "([{") - (c in ")]}")
        most = max(most, depth)
    if most > _MAX_DEPTH:
        raise ValueError(f"{where}: {expr!r}: brackets nested {most} deep, more than "
                         f"{_MAX_DEPTH}")
    return frozenset(read)


def _bad_node(node):
    """What is wrong with one node of an engine's expression ("" if nothing)."""
    if isinstance(node, (ast.Expression, ast.Load, ast.IfExp) + _BINOPS + _UNARY + _COMPARE
                  + (ast.And, ast.Or)):
        return ""
    if isinstance(node, ast.BinOp):
        return "" if isinstance(node.op, _BINOPS) else \
            f"operator {type(node.op).__name__} is not allowed (+ - * // % only)"
    if isinstance(node, (ast.UnaryOp, ast.BoolOp)):
        return ""
    if isinstance(node, ast.Compare):
        return "" if all(isinstance(op, _COMPARE) for op in node.ops) else \
            "only == != < <= > >= compare"
    if isinstance(node, ast.Name):
        return ""
    if isinstance(node, ast.Constant):
        v = node.value
        if type(v) is bool or (type(v) is int and 0 <= v < _U64):
            return ""
        return f"constant {v!r} is not an integer in 0 .. 2**64 - 1"
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in HELPERS:
            return "only " + ", ".join(HELPERS) + " may be called"
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args) or not node.args:
            return f"{node.func.id}() takes plain positional arguments"
        if node.func.id == "cdiv" and len(node.args) != 2:
            return "cdiv() takes two arguments"
        if node.func.id in ("max", "min") and len(node.args) < 2:
            # of one int they would iterate it: a TypeError at sizing
            return f"{node.func.id}() takes two or more arguments"
        if node.func.id.startswith("ceil") and len(node.args) != 1:
            return f"{node.func.id}() takes one argument"
        return ""
    return f"{type(node).__name__} is not allowed"


def parsed(expr):
    """The parsed form of an expression: what is compiled, alone or with
    others (`compiled`), never its text pasted into another's.

    Parameters
    ----------
    expr : str
        An expression (checked, or one of `TERMS`).

    Returns
    -------
    ast.expr
        Its tree (shared: not to be changed).
    """
    tree = _tree_cache.get(expr)
    if tree is None:
        tree = _tree_cache[expr] = ast.parse(expr.strip(), mode="eval").body
    return tree


def compiled(exprs):
    """One code object evaluating to the tuple of `exprs`' values, made from
    their parsed forms.

    Parameters
    ----------
    exprs : iterable of str
        Expressions (checked, or of `TERMS`).

    Returns
    -------
    code
    """
    tree = ast.Expression(ast.Tuple([parsed(e) for e in exprs], ast.Load()))
    return compile(ast.fix_missing_locations(tree), "<formulas>", "eval")


def _code(expr):
    # Compiled once per expression, from its parsed form.
    code = _code_cache.get(expr)
    if code is None:
        code = _code_cache[expr] = compile(ast.Expression(parsed(expr)), "<formula>", "eval")
    return code


def names_of(expr):
    """Every name an expression reads, including those inside comprehensions.

    Parameters
    ----------
    expr : str
        An expression (checked, or one of `TERMS`).

    Returns
    -------
    set of str
    """
    out, todo = set(), [_code(expr)]
    while todo:
        code = todo.pop()
        out.update(code.co_names)
        todo.extend(c for c in code.co_consts if hasattr(c, "co_names"))
    return out


# All of TERMS as one block of assignments (from their parsed forms), run once
# per evaluation.
_TERMS_CODE = compile(ast.fix_missing_locations(ast.Module(
    [ast.Assign([ast.Name(t.name, ast.Store())], parsed(t.expr)) for t in TERMS], [])),
    "<terms>", "exec")


def values(config, M, max_seq_len, kv_block_size, max_batch_size, target, env):
    """The value of every symbol for checked sizing inputs.

    The inputs (`SYMBOLS`) are read from the config fields, the limits, the
    target and the levers; the derived symbols (`TERMS`) are evaluated from
    their expressions, in order.

    Parameters
    ----------
    config : ModelConfig
        The model shape (already sharded for tensor parallelism).
    M, max_seq_len, kv_block_size, max_batch_size : int
        The serving limits, checked (`metrale.sizes.sizing_inputs`).
    target : Target
        The device sized for.
    env : mapping
        Where the levers are read (only ``env.get`` is called).

    Returns
    -------
    dict
        Symbol name -> value (int, bool, str, or the tuple ``layer_types``),
        inputs first, then the derived symbols in `TERMS` order.  `namespace`
        adds the long names (`ALIASES`) and the helpers.
    """
    ns = evaluation_namespace(config, M, max_seq_len, kv_block_size, max_batch_size, target, env)
    return {k: ns[k] for k in _ORDER}


# The symbols `values` returns, in order.
_ORDER = tuple(s.name for s in SYMBOLS) + tuple(t.name for t in TERMS)


def evaluation_namespace(config, M, max_seq_len, kv_block_size, max_batch_size, target, env):
    """`namespace` of `values`, made directly (the sizing evaluates every
    formula of a set in it).

    Parameters
    ----------
    config, M, max_seq_len, kv_block_size, max_batch_size, target, env : object
        As `values` takes them.

    Returns
    -------
    dict
        The helpers, every symbol and derived symbol, and the long names.
    """
    from .levers import lever_on
    from .sizes import resolve_splitk

    policy, pinned = resolve_splitk(target, env)
    v = {"M": M, "max_seq_len": max_seq_len, "kv_block_size": kv_block_size,
         "max_batch_size": max_batch_size}
    for s in _FIELD_SYMBOLS:
        v[s.name] = getattr(config, s.fields[0])
    v["sm_count"] = target.sm_count
    v["splitk_policy"], v["splitk_n"] = policy, pinned
    for lever, name in _SWITCHES:
        v[name] = lever_on(lever, env, config)      # the one lever rule
    ns = namespace(v)
    exec(_TERMS_CODE, ns)
    return ns


# The input symbols read from one config field each.
_FIELD_SYMBOLS = tuple(s for s in SYMBOLS if len(s.fields) == 1 and not s.levers)


def namespace(symbol_values):
    """The globals an expression is evaluated in: the helpers, the symbols
    and their long names.

    Parameters
    ----------
    symbol_values : dict
        As `values` returns it.

    Returns
    -------
    dict
        A new dict, with no builtins.
    """
    ns = dict(_HELPERS)
    ns["__builtins__"] = {}
    ns.update(symbol_values)
    for long, short in ALIASES.items():
        if short in ns:
            ns[long] = ns[short]
    return ns


def evaluate(expr, symbol_values):
    """Evaluate one expression (checked, or of the catalogue) for `symbol_values`.

    Parameters
    ----------
    expr : str
        The expression.
    symbol_values : dict
        As `values` returns it.

    Returns
    -------
    object
        Its value.
    """
    return eval(_code(expr), namespace(symbol_values))


def is_name(text):
    """Whether `text` is a plain ASCII identifier that is not a keyword (an
    identifier with other letters reads as another once Python folds it
    under NFKC: ``\uff4cogits`` is ``logits`` in source).

    Parameters
    ----------
    text : object
        What to test.

    Returns
    -------
    bool
    """
    return isinstance(text, str) and text.isascii() and text.isidentifier() and \
        not keyword.iskeyword(text)
