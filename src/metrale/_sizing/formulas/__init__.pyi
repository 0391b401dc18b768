from metrale._sizing.formulas._explain import (explanation as explanation, substitute as substitute,
                                               terms_used as terms_used)
from metrale._sizing.formulas._growth import Growth as Growth, first_shrinking as first_shrinking
from metrale._sizing.formulas._language import (check as check, compiled as compiled,
                                                evaluate as evaluate,
                                                evaluation_namespace as evaluation_namespace,
                                                is_name as is_name, names_of as names_of,
                                                namespace as namespace, parsed as parsed,
                                                sizes_of as sizes_of, term_values as term_values,
                                                values as values)
from metrale._sizing.formulas._table import (ALIASES as ALIASES,
                                             HELPER_FUNCTIONS as HELPER_FUNCTIONS,
                                             HELPERS as HELPERS, SYMBOLS as SYMBOLS, TERMS as TERMS,
                                             Symbol as Symbol, Term as Term)

__all__ = ["Symbol", "Term", "SYMBOLS", "TERMS", "ALIASES", "HELPERS", "check", "names_of",
           "values", "namespace"]
