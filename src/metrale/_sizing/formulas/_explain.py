"""The explanation of a formula: the derived terms it reads and, for given
symbol values, each step with the numbers put in (what ``metrale plan
--explain`` prints under a buffer's formula)."""

import re

from ._language import evaluate, names_of
from ._table import TERMS

__all__ = ["terms_used", "substitute", "explanation"]

_TERM_BY_NAME = {t.name: t for t in TERMS}
_NAME = re.compile(r"[A-Za-z_]\w*")


def terms_used(expr):
    """The derived symbols an expression reads, directly or through other
    derived symbols.

    Parameters
    ----------
    expr : str
        A checked expression of the language.

    Returns
    -------
    tuple of str
        Names from `TERMS`, in `TERMS` order.
    """
    seen, todo = set(), [expr]
    while todo:
        for n in names_of(todo.pop()):
            if n in _TERM_BY_NAME and n not in seen:
                seen.add(n)
                todo.append(_TERM_BY_NAME[n].expr)
    return tuple(t.name for t in TERMS if t.name in seen)


def substitute(expr, values):
    """`expr` with the values of its names put in.

    Parameters
    ----------
    expr : str
        A checked expression.
    values : dict
        Symbol values; only ints, bools and strs are put in (a tuple such
        as layer_types stays a name).

    Returns
    -------
    str
    """
    def put(m):
        x = values.get(m.group(0), _NAME)
        if x is _NAME or not isinstance(x, (int, str)):
            return m.group(0)
        return repr(x)
    return _NAME.sub(put, expr)


def explanation(expr, values=None):
    """The lines that explain `expr`: the formula and the terms it reads
    (``label, text`` pairs) and, with `values`, each term and then the formula
    with the numbers put in.

    Parameters
    ----------
    expr : str
        A checked expression (a buffer's size formula).
    values : dict, optional
        Symbol values (`metrale.formulas.values`).

    Returns
    -------
    formula : list of (str, str)
        ``("formula:", expr)`` and ``("where:", "T = its expression")`` for
        each term read (the label only on the first).
    evaluated : list of str
        Empty without `values`; else ``T = expression with numbers = value``
        for each term and ``formula with numbers = N bytes``.
    """
    used = terms_used(expr)
    formula = [("formula:", expr)] + [("" if j else "where:", f"{t} = {_TERM_BY_NAME[t].expr}")
                                      for j, t in enumerate(used)]
    evaluated = []
    if values is not None:
        for t in used:
            v = values[t]
            evaluated.append(f"{t} = {v}" if isinstance(v, bool) else
                             f"{t} = {substitute(_TERM_BY_NAME[t].expr, values)} = {v:,}")
        evaluated.append(f"{substitute(expr, values)} = {evaluate(expr, values):,} bytes")
    return formula, evaluated
