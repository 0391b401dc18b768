"""The device an arena is sized for (`Target`) and the split-K policy in
effect for it (`resolve_splitk`): the inputs of the ``splitk_workspace``
formula.  Below the formula language (`metrale.formulas` reads the policy
through `resolve_splitk`); ``metrale.sizes.Target`` is this class.
"""

from .._base._common import check_index
from .._base._record import Record

__all__ = ["Target", "SPLITK_POLICIES", "resolve_splitk"]

_MAX_DECODE_SPLITS = 16
_PINNED = tuple(str(n) for n in range(1, _MAX_DECODE_SPLITS + 1))
# Every value Target.splitk takes: the two policies, then the pinned counts.
SPLITK_POLICIES = ("legacy", "auto") + _PINNED


class Target(Record):
    """The device an arena is sized for: its SM count and split-K policy.

    The split-K decode attention keeps one float32 slot of ``head_dim + 2``
    values per (sequence, query head, split) in ``splitk_workspace``; the
    target decides how many slots, and so that buffer's size.  A backend's
    ``target()`` describes its device.  The METRALE_ATTN_DECODE_SPLITK
    variable overrides the policy (see `resolve_splitk`).

    Parameters
    ----------
    sm_count : int
        Streaming multiprocessors of the device (>= 0).
    splitk : str
        ``"legacy"`` (one slot per SM, whatever the batch),
        ``"auto"`` (splits from the SM count and the query heads, for up to
        the widest decode batch), or a pinned split count ``"1"`` ... ``"16"``.

    Attributes
    ----------
    sm_count : int
        As given.
    splitk : str
        As given.

    Raises
    ------
    TypeError
        `sm_count` is not an int or `splitk` is not a str.
    ValueError
        `sm_count` is negative or does not fit 64 bits, or `splitk` is not
        one of the policies above.
    """

    __slots__ = ("sm_count", "splitk")

    def __init__(self, sm_count, splitk):
        sm_count = check_index(sm_count, "sm_count")
        if not isinstance(splitk, str):
            raise TypeError(f"splitk must be a str, got {type(splitk).__name__}")
        if splitk not in SPLITK_POLICIES:
            raise ValueError(f"splitk must be 'legacy', 'auto' or '1' ... '16', got {splitk!r}")
        super().__init__(sm_count, splitk)

    @classmethod
    def reference(cls):
        """The reference build target: 48 SMs, legacy split-K.

        What `BufferSizes.from_config` uses when no target is given, and
        what ``HostBackend().target()`` returns.

        Returns
        -------
        Target
            ``Target(48, "legacy")``.
        """
        return cls(48, "legacy")


def resolve_splitk(target, env):
    """The split-K policy in effect for `target` under `env`.

    ``METRALE_ATTN_DECODE_SPLITK`` in `env`, trimmed and lower-cased,
    overrides ``target.splitk``: ``"legacy"`` and ``"auto"`` select those
    policies, ``"0"``, ``"off"``, ``"false"`` and ``"no"`` pin one split, a
    decimal count n >= 1 pins n splits, and any other value is ignored.  An
    engine that launches the split-K decode attention should resolve its
    policy with this function too, so that the launch and the workspace
    always agree.

    Parameters
    ----------
    target : Target
        The device's target.
    env : mapping
        Where the variable is read; only ``env.get`` is called.

    Returns
    -------
    tuple of (str, int)
        ``("legacy", 0)``, ``("auto", 0)`` or ``("pinned", n)``.  A pinned n
        is not clamped here; the sizing uses at most 16 splits.
    """
    policy = _splitk_override(env.get("METRALE_ATTN_DECODE_SPLITK")) or target.splitk
    if policy in ("legacy", "auto"):
        return policy, 0
    return "pinned", int(policy)


def _splitk_override(raw):
    """The policy a METRALE_ATTN_DECODE_SPLITK value selects, or None when
    the value is ignored."""
    if not isinstance(raw, str):
        return None
    v = raw.strip().lower()
    if v in ("legacy", "auto"):
        return v
    if v in ("0", "off", "false", "no"):
        return "1"
    if v.isascii() and v.isdigit() and v.strip("0"):
        v = v.lstrip("0")
        # A count past any split count pins the most the sizing uses; int()
        # of thousands of digits would raise instead.
        return v if len(v) <= 4 else str(_MAX_DECODE_SPLITS)
    return None
