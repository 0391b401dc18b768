"""Names a slip away from what was typed ("did you mean"), for the
refusals that name an unknown buffer or field.  Pure Python.

difflib's ratio (cutoff 0.6) is lenient on short names ('nope' is 0.6 from
'ignore', 0.67 from 'notes'): suggest only a name equal but for case or
separators, one edit away (a swap of neighbours counts one; two from 8
characters), or of the same words: its first ('lora' -> lora_xa), its last
two or more ('gate_out' -> expert_gate_out), or two or more, at least half
the typed ones ('ffn_act_q8' -> ffn_act_scale).
"""

__all__ = ["near_names"]


def _words(text):
    return [w for w in text.lower().replace("-", "_").replace(" ", "_").split("_") if w]


def _edits(a, b, limit):
    """The optimal-string-alignment distance of a and b, capped at limit + 1."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2, prev = None, list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        if min(cur) > limit:
            return limit + 1
        prev2, prev = prev, cur
    return min(prev[-1], limit + 1)


def near_names(name, names, n=3):
    """At most `n` of `names` close to `name`: "did you mean".

    Parameters
    ----------
    name : str
        What was typed.
    names : iterable of str
        The names there are, in their order.
    n : int, optional
        The most to give.

    Returns
    -------
    list of str
        Closest first, then in the order of `names`.
    """
    typed = _words(name)
    flat, k = "_".join(typed), len(typed)
    limit = 0 if len(flat) <= 2 else 1 if len(flat) <= 7 else 2
    found = []
    for order, cand in enumerate(names):
        words = _words(cand)
        d = _edits(flat, "_".join(words), limit)
        if d > limit and not ((len(flat) >= 3 and k < len(words) and typed == words[:k])
                              or (2 <= k < len(words) and typed == words[-k:])
                              or 2 <= len(set(typed) & set(words)) >= k / 2):
            continue
        found.append((d, order, cand))
    return [cand for _, _, cand in sorted(found)[:n]]
