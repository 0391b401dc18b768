"""The abstract growth analysis of the formula language: whether a formula is
non-decreasing in max_batch_tokens for a model and limits, which `fit` needs
to search exactly.
"""

import ast

from ._language import names_of, parsed
from ._table import ALIASES, HELPER_FUNCTIONS, TERMS

__all__ = ["Growth", "first_shrinking"]

# -- monotonicity: what makes the search exact ------------------------------------------------
#
# fit's search needs every size non-decreasing in max_batch_tokens (the layout
# then is: see metrale.fitting._largest_fitting).  The reference formulas are (the tests check
# them at every M up to 1,200 on every preset); an engine's own may not be
# (``M % 7``, ``4096 - M``), so each formula is proved so before a search: an
# abstract evaluation over M >= 1 with every other symbol at its value for the
# model and limits.  A value is ("c", v): the same for every M; ("v", d, nn):
# non-decreasing (d = 1) or non-increasing (d = -1) in M, never negative when
# nn; or None: not known.  Sound, not complete: None where a rule is not sure
# (a condition that reads M, ``%`` of M), and the fit then refuses to search.

_UP = 1


def _const(v):
    return ("c", v)


def _dir(a):
    """(direction, never negative) of a known value; a constant has direction 0."""
    if a[0] == "c":
        return 0, a[1] >= 0
    return a[1], a[2]


def _joined(parts, nonneg):
    """The value of a function non-decreasing in each of `parts`, or None
    when two of them move in opposite directions."""
    dirs = {_dir(p)[0] for p in parts} - {0}
    if len(dirs) > 1:
        return None
    return ("v", dirs.pop(), nonneg) if dirs else None


def _flip(a):
    return ("c", -a[1]) if a[0] == "c" else ("v", -a[1], False)


def _quotient(a, b):
    """a // b (or cdiv(a, b)), a and b known, b not constant, b >= 0 where it
    is defined: the quotient moves with a and against b."""
    (db, nnb), nna = _dir(b), _dir(a)[1]
    if not (nna and nnb):
        return None
    return _joined([a, ("v", -db, True)], True)


_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b,
           ast.Mod: lambda a, b: a % b}
_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
            ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
            ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}


class Growth:
    """The abstract evaluation of formulas over max_batch_tokens >= 1, every
    other symbol fixed (the module's comment says what a value is).

    Parameters
    ----------
    symbols : dict
        Every symbol's value for one model and limits (`values`); ``M`` is
        the one that varies.
    """

    _terms = None           # (aliases, term name -> expr, the terms that read M)

    def __init__(self, symbols):
        if Growth._terms is None:
            reads_m = set()             # through earlier terms too
            for t in TERMS:
                if any(ALIASES.get(n, n) in reads_m or ALIASES.get(n, n) == "M"
                       for n in names_of(t.expr)):
                    reads_m.add(t.name)
            Growth._terms = (ALIASES, {t.name: t.expr for t in TERMS}, frozenset(reads_m))
        self.aliases, self.terms, self.reads_m = Growth._terms
        self.symbols = symbols
        self.memo = {}

    def of(self, expr):
        """How `expr` moves with max_batch_tokens.

        Parameters
        ----------
        expr : str
            A checked formula, or one of `TERMS`.

        Returns
        -------
        tuple or None
            ``("c", v)``: the same value v for every M; ``("v", d, nn)``:
            non-decreasing (d = 1) or non-increasing (d = -1), never negative
            when nn; None: not known.
        """
        v = self.memo.get(expr, self)
        if v is self:
            try:
                v = self._node(parsed(expr))
            except (ArithmeticError, KeyError, TypeError, ValueError, RecursionError):
                v = None        # a constant part that fails: the sizing says why
            self.memo[expr] = v
        return v

    def _node(self, n):
        if isinstance(n, ast.Constant):
            return _const(n.value)
        if isinstance(n, ast.Name):
            name = self.aliases.get(n.id, n.id)
            if name == "M":
                return ("v", _UP, True)
            if name in self.reads_m:
                return self.of(self.terms[name])
            return _const(self.symbols[name])
        if isinstance(n, ast.IfExp):
            test = self._node(n.test)
            if test is None or test[0] != "c":
                return None
            return self._node(n.body if test[1] else n.orelse)
        if isinstance(n, ast.BinOp):
            return self._binary(type(n.op), self._node(n.left), self._node(n.right))
        if isinstance(n, ast.UnaryOp):
            a = self._node(n.operand)
            if a is None:
                return None
            if isinstance(n.op, ast.USub):
                return _flip(a)
            if isinstance(n.op, ast.UAdd):
                return a
            return _const(not a[1]) if a[0] == "c" else None
        if isinstance(n, ast.Call):
            args = [self._node(x) for x in n.args]
            if any(a is None for a in args):
                return None
            name = n.func.id
            if all(a[0] == "c" for a in args):
                return _const(HELPER_FUNCTIONS[name](*(a[1] for a in args)))
            if name in ("max", "min"):
                nn = [_dir(a)[1] for a in args]
                return _joined(args, any(nn) if name == "max" else all(nn))
            if name == "cdiv":
                return self._binary(ast.FloorDiv, *args)
            return _joined(args, _dir(args[0])[1])          # ceilN
        if isinstance(n, ast.Compare):
            parts = [self._node(n.left)] + [self._node(x) for x in n.comparators]
            if any(a is None or a[0] != "c" for a in parts):
                return None
            return _const(all(_COMPARE[type(op)](parts[i][1], parts[i + 1][1])
                              for i, op in enumerate(n.ops)))
        if isinstance(n, ast.BoolOp):
            parts = [self._node(x) for x in n.values]
            if any(a is None or a[0] != "c" for a in parts):
                return None
            v = parts[0][1]
            for a in parts[1:]:
                if (not v) if isinstance(n.op, ast.And) else v:
                    break
                v = a[1]
            return _const(v)
        return None

    def _binary(self, op, a, b):
        if op is ast.Mult and ("c", 0) in (a, b):
            return _const(0)                # whatever the other factor does
        if a is None or b is None:
            return None
        if a[0] == "c" and b[0] == "c":
            return _const(_BINARY[op](a[1], b[1]))
        if op is ast.Add:
            return _joined([a, b], _dir(a)[1] and _dir(b)[1])
        if op is ast.Sub:
            return self._binary(ast.Add, a, _flip(b))
        if op is ast.Mult:
            if b[0] == "c":
                a, b = b, a
            if a[0] == "c":                 # c * x: with x, against it, or 0
                if a[1] == 0:
                    return _const(0)
                d, nn = _dir(b)
                return ("v", d, nn) if a[1] > 0 else ("v", -d, False)
            (da, nna), (db, nnb) = _dir(a), _dir(b)
            return ("v", da, True) if nna and nnb and da == db else None
        if op is ast.FloorDiv:
            if b[0] == "c":                 # x // c: with x for c > 0
                if b[1] <= 0:
                    return None
                d, nn = _dir(a)
                return ("v", d, nn)
            return _quotient(a, b)
        return None                         # % of something that moves with M


def first_shrinking(buffers, symbols):
    """The first spec of `buffers` whose size is not proved non-decreasing in
    max_batch_tokens.

    Kept with the set for the last few models and limits: a fit costs about
    ten evaluations, the analysis of the 46 reference formulas about as much
    again.

    Parameters
    ----------
    buffers : BufferSet
        The set.
    symbols : dict
        Every symbol's value for one model and limits (`values`).

    Returns
    -------
    BufferSpec or None
        None when every size is proved non-decreasing.
    """
    seen = buffers._cache.setdefault("fit_shrinking", {})
    key = tuple(symbols.values())
    found = seen.get(key, seen)
    if found is seen:
        growth = Growth(symbols)
        found = None
        for s in buffers:
            v = growth.of(s.formula)
            if v is None or (v[0] == "v" and v[1] != _UP):
                found = s
                break
        if len(seen) >= 16:
            seen.clear()
        seen[key] = found
    return found
