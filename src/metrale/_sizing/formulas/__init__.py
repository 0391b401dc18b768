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

The language has one home, this package: its vocabulary and the one helper
table (`_table`), its grammar, parser and evaluator (`_language`: each text
parsed once, a whole set compiled into one code object, `sizes_of`), the
abstract growth analysis `fit` relies on (`_growth`) and the explanation of a
formula that ``metrale plan --explain`` prints (`_explain`).  Pure Python, below the
buffer sets and the sizing: it reads the split-K policy (`metrale.target`)
and the levers (`metrale.levers`), nothing above them.
"""

from ._table import (ALIASES, HELPER_FUNCTIONS, HELPERS, SYMBOLS, TERMS, Symbol, Term)
from ._language import (check, compiled, evaluate, evaluation_namespace, is_name, names_of,
                        namespace, parsed, sizes_of, term_values, values)
from ._growth import Growth, first_shrinking
from ._explain import explanation, substitute, terms_used

__all__ = ["Symbol", "Term", "SYMBOLS", "TERMS", "ALIASES", "HELPERS", "check", "names_of",
           "values", "namespace"]
