"""What `metrale plan` and `metrale fit` share: the arguments that name the
model, the limits and the buffer set, read into typed values, and the exit
statuses and the one-line error."""

import os
import sys

from .._sizing.buffers import BufferSet
from .._sizing.config import ModelConfig
from .._sizing.levers import LEVERS
from .._sizing.reference import REFERENCE
from .._sizing.target import SPLITK_POLICIES, Target

# Exit statuses: 2 for what the user typed (flags, values, the config file),
# 1 for what failed while running (an allocation refused, a driver error).
USAGE, RUNTIME = 2, 1


def _levers_help():
    import textwrap
    lines = ["environment levers (read at run time; the plan reports those in effect):"]
    for lv in LEVERS:
        lines.append(f"  {lv.name}")
        lines += textwrap.wrap(f"{lv.effect}; {lv.rule}.", 76, initial_indent=" " * 6,
                               subsequent_indent=" " * 6)
    return "\n".join(lines)


def _model_args(p):
    """--preset / --config and --strict: the model, as plan and fit take it."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", choices=ModelConfig.presets(), help="a bundled model shape")
    src.add_argument("--config", metavar="PATH", help="a Hugging Face config.json (or its directory)")
    p.add_argument("--strict", action="store_true",
                   help="refuse a --config whose keys metrale does not understand whole, "
                   "instead of listing them")


def _buffer_args(p):
    """--buffers and --drop: the buffer set, as plan and fit take it."""
    p.add_argument("--buffers", metavar="FILE",
                   help="the engine's own buffer set, a TOML or JSON file (docs/buffer-sets.md); "
                   "default: the reference engine's 46 buffers")
    p.add_argument("--drop", metavar="NAME", action="append", default=[],
                   help="leave buffer NAME out of the set (repeatable)")


def _limit_args(p):
    """The serving limits but max_batch_tokens, the target and --tp."""
    p.add_argument("--max-seq-len", type=int, default=4096, metavar="N",
                   help="longest sequence the KV cache serves (default: %(default)s)")
    p.add_argument("--kv-block-size", type=int, default=16, metavar="N",
                   help="tokens per paged-KV block; 0 means 256 blocks (default: %(default)s)")
    p.add_argument("--max-batch-size", type=int, default=32, metavar="N",
                   help="most sequences in one batched decode step (default: %(default)s)")
    p.add_argument("--sm-count", type=int, default=None,
                   help="size for a device with this many SMs; switches the split-K policy "
                   "to 'auto' unless --splitk is given (default: the reference target, "
                   "48 SMs, 'legacy')")
    p.add_argument("--splitk", default=None, choices=SPLITK_POLICIES, metavar="{legacy,auto,1..16}",
                   help="split-K policy of the target (default: 'legacy', or 'auto' with "
                   "--sm-count)")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="size what one rank of N tensor-parallel ranks holds (default: "
                   "%(default)s, the whole model)")


def _mib(n):
    return f"{n / 1048576:,.2f}"


def _buffer_set(args):
    """The buffer set of --buffers less --drop, and its record for the output."""
    path, drop = getattr(args, "buffers", None), getattr(args, "drop", None) or []
    buffers = REFERENCE
    if path is not None:
        try:
            buffers = BufferSet.load(path)
        except OSError as e:
            raise OSError(f"--buffers {path}: cannot read it: {e.strerror or e}") from None
        except (ValueError, TypeError) as e:        # the message starts with the file
            raise type(e)(f"--buffers {e}") from None
    if drop:
        try:
            buffers = buffers.without(drop)
        except ValueError as e:
            raise ValueError(f"--drop: {e}" + (f" (the set of {path})" if path else "")) from None
    record = {"reference": buffers == REFERENCE, "file": path,
              "dropped": list(dict.fromkeys(drop)), "fingerprint": buffers.fingerprint(),
              "count": len(buffers), "names": list(buffers.names)}
    return buffers, record


class _SpecErrors:
    """Names the --buffers file in an error of one of its specs that only the
    sizing finds (a size that is negative, divides by zero or overflows at
    these limits)."""

    def __init__(self, args):
        self.path = getattr(args, "buffers", None)

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        text = str(e)
        spec = "buffer spec '" in text or text.startswith(("size of ", "the sum of all"))
        if self.path and kind in (ValueError, TypeError) and spec \
                and not text.startswith("--buffers"):
            raise kind(f"--buffers {self.path}: {text}") from None
        return False


def _set_line(record):
    """The set, in words: the header line of plan and fit when one was given."""
    what = f"from {record['file']}" if record["file"] else "REFERENCE"
    if record["dropped"]:
        what += " without " + ", ".join(record["dropped"])
    if record["reference"] and (record["file"] or record["dropped"]):
        what += ": the same as REFERENCE"
    return f"buffers: {record['count']} ({what}), fingerprint {record['fingerprint']}"


def _model(args):
    """The model of the plan, and what its config.json left not understood:
    a list of {"key", "message"} (empty for a preset)."""
    if args.preset:
        return ModelConfig.preset(args.preset), []
    import warnings
    from .._base.errors import ConfigWarning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        config = ModelConfig.from_hf_config(args.config, strict=args.strict)
    notes = [{"key": w.message.key, "message": str(w.message)} for w in caught
             if isinstance(w.message, ConfigWarning)]
    for w in caught:                 # anything else goes on as it came
        if not isinstance(w.message, ConfigWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return config, notes


def _target(args):
    # --sm-count alone describes another device: its split-K policy is 'auto'.
    ref = Target.reference()
    return Target(ref.sm_count if args.sm_count is None else args.sm_count,
                  args.splitk or ("auto" if args.sm_count is not None else ref.splitk))


def _closed_pipe():
    # The reader left (`metrale plan ... | head -1`): it had what it wanted,
    # so the status is 0, as when it left after the last line (which of the
    # two happens is a race).  Point stdout at devnull so the flush at exit
    # cannot raise again.
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0


def _fail(message, status):
    # One line, whatever the message holds.
    print("metrale: error: " + " ".join(str(message).split()), file=sys.stderr)
    return status


def _svg_clash(args):
    """The failure status of ``--svg -`` beside an option that also writes
    to stdout (``--json``, ``--explain``), or None."""
    if args.svg == "-" and (args.json or args.explain):
        other = "--json" if args.json else "--explain"
        return _fail(f"--svg - and {other} both write to stdout: give --svg a file name "
                     "(see metrale --help)", USAGE)
    return None


def _svg_out(path, svg):
    """``--svg PATH``: write `svg` to the file, or, for ``-``, give it back
    for stdout to carry alone (None otherwise)."""
    if path == "-":
        return svg
    with open(path, "w", encoding="utf-8") as f:
        f.write(svg)
    return None
