"""The step roles a buffer can have (docs/step-inputs.md): what it holds of
the inputs an engine uploads every step (its spec's ``step``), the element
types each role takes, and what a spec's role and a set's roles must agree
on.  Pure Python, below the spec (metrale._sizing._spec checks a spec's role
with it).
"""

__all__ = ["STEP_ROLES", "STEP_IDS", "STEP_META", "STEP_FILL_NAMES", "check_step",
           "check_step_roles", "default_step"]

# The step inputs (StepInputs, docs/step-inputs.md): what a buffer holds of
# what an engine uploads every step (its spec's `step`), with the element
# types each role takes.  The slab places them first, back to back, in this
# order (the token ids, the others as declared, the reference's decode
# metadata last): one upload reaches them all.
_INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
STEP_ROLES = {
    "token_ids": ("the step's token ids (fill's first argument)", _INTS),
    "count": ("the step's token count, int32: the zeroing of upload reads it on the device",
              ("int32",)),
    "positions": ("the positions of the step's tokens or rows", _INTS),
    "metadata": ("any other per-step input (block tables, slot mappings, lengths...), filled "
                 "by the buffer's name", _INTS + ("float16", "float32", "float64")),
    "decode_meta": ("the reference's byte scratch: the token count at +32,752 and the "
                    "batched-decode metadata (DecodeMetaLayout) at +32,768", None),
}
# The reference's two, whose names still give them their role when `step` is
# not given (sets written before `step` existed).
STEP_IDS, STEP_META = "token_ids", "scratch"
_STEP_BY_NAME = {STEP_IDS: "token_ids", STEP_META: "decode_meta"}
# StepInputs.fill's own keywords: a metadata buffer, filled by its name, may
# not take one.
STEP_FILL_NAMES = frozenset({"self", "token_ids", "tokens", "count", "positions", "seq_slot",
                             "slots", "seq_lens", "block_table"})


def default_step(name):
    """The role a buffer of this name has when its spec gives none.

    Parameters
    ----------
    name : str
        The buffer's name.

    Returns
    -------
    str
        The reference's role of that name, or "" (none).
    """
    return _STEP_BY_NAME.get(name, "")


def check_step(where, name, step, dtype, zero_all, rows, align):
    """The spec's step role, checked against its other fields.

    Parameters
    ----------
    where : str
        The spec, for the messages.
    name, step, dtype, zero_all, rows, align
        The spec's fields (`step` None: the name's role).

    Returns
    -------
    str
        The role ("" for none).

    Raises
    ------
    TypeError, ValueError
        A role the spec's other fields refuse (each named).
    """
    if step is None:
        step = default_step(name)
    if not isinstance(step, str):
        raise TypeError(f"{where}: step must be a str or None, got {type(step).__name__}")
    if step == "":
        return step
    if step not in STEP_ROLES:
        raise ValueError(f"{where}: step must be one of {', '.join(STEP_ROLES)} (or '' for "
                         f"none), got {step!r}")
    types = STEP_ROLES[step][1]
    if types is not None and dtype not in types:
        raise ValueError(f"{where}: step={step!r} holds {' or '.join(types)} values (the "
                         f"staging checks what fill writes by its type), got dtype {dtype!r}")
    if step == "metadata" and name in STEP_FILL_NAMES:
        raise ValueError(f"{where}: step='metadata': fill takes a metadata buffer by its name, "
                         f"and {name!r} is one of its own keywords; rename the buffer")
    # The upload writes them every step before its zeroing; a helper would
    # erase them (and the slab keeps zero_all one range after them).  The
    # reference's scratch is cleared by zero_all: its decode metadata is
    # uploaded after (docs/step-inputs.md).
    if step != "decode_meta" and (zero_all or rows != "whole"):
        raise ValueError(f"{where}: zero_all: the step inputs upload {step} every step, "
                         "before the zeroing; a helper would erase them")
    if align != 256:
        raise ValueError(f"{where}: align: the step inputs' buffers sit back to back (one "
                         "upload reaches them all): 256 only")
    return step



def check_step_roles(specs):
    """What a set's step roles must agree on (`BufferSet` checks it).

    One buffer per role but ``metadata`` (the staging names their regions
    by role), and no ``count`` or ``positions`` beside the reference's
    ``decode_meta``, which holds its own.  The spec checks the rest.

    Parameters
    ----------
    specs : sequence of BufferSpec
        The set's specs.

    Raises
    ------
    ValueError
        A role held twice, or beside ``decode_meta`` (both named).
    """
    seen = {}
    for s in specs:
        if s.step and s.step != "metadata":
            if s.step in seen:
                raise ValueError(f"buffer spec {s.name!r}: step={s.step!r}: "
                                 f"{seen[s.step]!r} holds it already (one per set)")
            seen[s.step] = s.name
    # the reference's decode metadata holds a count and positions of its own
    for role in ("count", "positions"):
        if role in seen and "decode_meta" in seen:
            raise ValueError(f"buffer spec {seen[role]!r}: step={role!r}: "
                             f"{seen['decode_meta']!r} (step='decode_meta') holds the {role} "
                             "already; declare another per-step buffer step='metadata'")
