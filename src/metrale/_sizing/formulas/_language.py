"""The formula language's grammar and evaluator: `check` an engine's
expression, parse each text once (`parsed`), compile a set's formulas into one
code object (`compiled`), and evaluate them (`values`, `namespace`,
`evaluate`, `sizes_of`).
"""

import ast
import keyword

from ..levers import lever_on
from ._table import (ALIASES, CALLABLE, HELPERS, SWITCHES, SYMBOLS, TERMS, USABLE)

__all__ = ["check", "parsed", "compiled", "names_of", "values", "evaluation_namespace",
           "namespace", "evaluate", "is_name", "term_values", "sizes_of"]

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
            if node.id not in USABLE:
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
    return _cached(_tree_cache, expr, lambda e: ast.parse(e.strip(), mode="eval").body)


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
    return _cached(_code_cache, expr,
                   lambda e: compile(ast.Expression(parsed(e)), "<formula>", "eval"))


def _cached(cache, key, make):
    """cache[key], made by make(key) the first time; the cache starts again
    past 4096 entries (an engine's formulas are a few hundred)."""
    v = cache.get(key)
    if v is None:
        if len(cache) > 4096:
            cache.clear()
        v = cache[key] = make(key)
    return v


def _assignments(terms):
    """One code object assigning each of `terms` in order, from their parsed forms."""
    return compile(ast.fix_missing_locations(ast.Module(
        [ast.Assign([ast.Name(t.name, ast.Store())], parsed(t.expr)) for t in terms], [])),
        "<terms>", "exec")


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


# All of TERMS as one block of assignments, run once per evaluation.
_TERMS_CODE = _assignments(TERMS)


def values(config, M, max_seq_len, kv_block_size, max_batch_size, target, env, tp_size=1):
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
    tp_size : int, optional
        The ranks `config` was sharded over (`ModelConfig.shard`), checked;
        symbol ``tp`` (default 1: `config` is the whole model).

    Returns
    -------
    dict
        Symbol name -> value (int, bool, str, or the tuple ``layer_types``),
        inputs first, then the derived symbols in `TERMS` order.  `namespace`
        adds the long names (`ALIASES`) and the helpers.
    """
    ns = evaluation_namespace(config, M, max_seq_len, kv_block_size, max_batch_size, target, env,
                              tp_size)
    return {k: ns[k] for k in _ORDER}


# The symbols `values` returns, in order.
_ORDER = tuple(s.name for s in SYMBOLS) + tuple(t.name for t in TERMS)


def evaluation_namespace(config, M, max_seq_len, kv_block_size, max_batch_size, target, env,
                         tp_size=1):
    """`namespace` of `values`, made directly (the sizing evaluates every
    formula of a set in it).

    Parameters
    ----------
    config, M, max_seq_len, kv_block_size, max_batch_size, target, env, tp_size : object
        As `values` takes them.

    Returns
    -------
    dict
        The helpers, every symbol and derived symbol, and the long names.
    """
    # target loads the compiled argument checks (metrale._base._common), which the
    # build's reading of the reference table (tools/gen_buffers.py) must not.
    from ..target import resolve_splitk

    policy, pinned = resolve_splitk(target, env)
    v = {"M": M, "max_seq_len": max_seq_len, "kv_block_size": kv_block_size,
         "max_batch_size": max_batch_size, "tp": tp_size}
    v.update(_config_symbols(config))
    v["sm_count"] = target.sm_count
    v["splitk_policy"], v["splitk_n"] = policy, pinned
    for lever, name in SWITCHES:
        v[name] = lever_on(lever, env, config)      # the one lever rule
    ns = namespace(v)
    exec(_TERMS_CODE, ns)
    return ns


# The input symbols read from one config field each.
_FIELD_SYMBOLS = tuple(s for s in SYMBOLS if len(s.fields) == 1 and not s.levers)


def _config_symbols(config):
    """The input symbols `config` gives, one field each."""
    return {s.name: getattr(config, s.fields[0]) for s in _FIELD_SYMBOLS}


def term_values(config, M, names):
    """Some derived symbols (`TERMS`) for a config and M alone.

    For the layouts that live inside one buffer (the FP8 MoE slab: its
    regions are the ``moe_*`` terms), evaluated from the same expressions
    the sizing evaluates.

    Parameters
    ----------
    config : ModelConfig
        The model shape.
    M : int
        The rows (checked by the caller).
    names : iterable of str
        Terms that read only M and config fields, directly or through
        earlier terms.

    Returns
    -------
    dict
        Each of `names` -> its value.

    Raises
    ------
    KeyError
        A term reads a limit, the target or a lever.
    """
    v = _config_symbols(config)
    v["M"] = M
    ns = namespace(v)
    want = frozenset(names)
    code = _terms_code_for(want)
    try:
        exec(code, ns)
    except NameError as e:
        raise KeyError(f"a term of {sorted(want)} reads more than M and the config: {e}") from None
    return {n: ns[n] for n in names}


_terms_codes = {}


def _terms_code_for(want):
    """The assignments of the terms in `want` and of those they read, in
    TERMS order (compiled once per set of names)."""
    code = _terms_codes.get(want)
    if code is None:
        by_name = {t.name: t for t in TERMS}
        unknown = sorted(want - set(by_name))
        if unknown:
            raise KeyError(f"{unknown[0]!r} is not a term")
        need, todo = set(), list(want)
        while todo:
            n = todo.pop()
            if n in by_name and n not in need:
                need.add(n)
                todo.extend(names_of(by_name[n].expr))
        code = _terms_codes[want] = _assignments([t for t in TERMS if t.name in need])
    return code


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
    ns = dict(CALLABLE)
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


def sizes_of(buffers, ns):
    """Every size of a buffer set, evaluated in one namespace.

    One code object per set (`compiled`, kept with the set), so that sizing
    a set costs one evaluation.

    Parameters
    ----------
    buffers : BufferSet
        The set; each spec's `formula` is evaluated.
    ns : dict
        As `evaluation_namespace` makes it.

    Returns
    -------
    tuple of int
        The sizes in the set's order.

    Raises
    ------
    ValueError
        A formula fails (divides by zero) or is not a size in bytes (negative,
        not an int): the message names the spec and max_batch_tokens.
    """
    code = buffers._cache.get("sizing")
    if code is None:
        code = buffers._cache["sizing"] = compiled(s.formula for s in buffers)
    try:
        values = eval(code, ns)
    except ArithmeticError:
        values = None
    if values is None or any(type(v) is not int or v < 0 for v in values):
        for s in buffers:           # name the first one that fails
            try:
                v = eval(compiled((s.formula,)), ns)[0]
            except ArithmeticError as e:
                raise ValueError(f"buffer spec {s.name!r}: size: {s.formula} fails at "
                                 f"max_batch_tokens={ns['M']}: {e}") from None
            if type(v) is not int or v < 0:
                raise ValueError(f"buffer spec {s.name!r}: size: {s.formula} = {v!r} at "
                                 f"max_batch_tokens={ns['M']}, not a size in bytes")
    return values
