"""`metrale plan`: the arena ledger of a model, on the host backend (no GPU); `metrale fit`:
the largest max_batch_tokens whose arena fits a memory budget."""

import argparse
import json
import os
import sys

import metrale
from metrale.buffers import BufferSet
from metrale.config import ModelConfig
from metrale.errors import MetraleError
from metrale.levers import LEVERS
from metrale.reference import REFERENCE
from metrale.sizes import SPLITK_POLICIES, BufferSizes, Target

# Exit statuses: 2 for what the user typed (flags, values, the config file),
# 1 for what failed while running (an allocation refused, a driver error).
USAGE, RUNTIME = 2, 1


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    # argparse prints the usage and exits; metrale prints one line and returns 2.
    def error(self, message):
        raise _UsageError(message)


def _levers_help():
    import textwrap
    lines = ["environment levers (read at run time; the plan reports those in effect):"]
    for lv in LEVERS:
        lines.append(f"  {lv.name}")
        lines += textwrap.wrap(f"{lv.effect}; {lv.rule}.", 76, initial_indent=" " * 6,
                               subsequent_indent=" " * 6)
    return "\n".join(lines)


def _parser():
    p = _Parser(prog="metrale", description=__doc__)
    p.add_argument("--version", action="version", version=f"metrale {metrale.__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="print the buffer ledger of an arena",
                          description="The buffers of one forward pass for a model and serving "
                          "limits: sizes, offsets in the one slab, the zeroing ranges.",
                          epilog=_levers_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    _model_args(plan)
    plan.add_argument("--max-batch-tokens", type=int, default=8192, metavar="M",
                      help="most tokens one forward pass carries (default: %(default)s)")
    _limit_args(plan)
    _buffer_args(plan)
    plan.add_argument("--tokens", type=int, default=1, metavar="T",
                      help="live tokens for the zero_all_rows(T) ranges reported (default: %(default)s)")
    plan.add_argument("--allocate", action="store_true",
                      help="also build the arena on the host backend and zero it")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    plan.add_argument("--explain", metavar="BUFFER",
                      help="print what one buffer holds, its formula and its size here")
    plan.add_argument("--svg", metavar="FILE",
                      help="also draw the slab to scale, with the zeroing ranges, as SVG")
    _fit_parser(sub)
    return p


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


def _fit_parser(sub):
    fit = sub.add_parser(
        "fit", help="the largest max_batch_tokens whose arena fits a budget",
        description="How many tokens fit: the largest max_batch_tokens whose arena fits in a\n"
        "memory budget (or, with --max-batch-tokens, the arena at that M), the KV-cache\n"
        "tokens that fit in what it leaves, and the headroom. Computed from the sizing\n"
        "formulas and the layout; nothing is allocated. Sizes take a unit: B, kB, MB, GB,\n"
        "TB, PB (powers of 1000) or KiB, MiB, GiB, TiB, PiB (powers of 1024), e.g. 12GiB\n"
        "or '80 GB'; no unit means bytes.",
        epilog=_levers_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    _model_args(fit)
    budget = fit.add_mutually_exclusive_group(required=True)
    budget.add_argument("--budget", metavar="SIZE",
                        help="device memory for the arena and the KV cache, e.g. 12GiB")
    budget.add_argument("--gpu-mem", metavar="SIZE",
                        help="the GPU's memory; the budget is this less --weights")
    fit.add_argument("--weights", metavar="SIZE", default=None,
                     help="with --gpu-mem: the model weights' bytes on this GPU (default: 0)")
    fit.add_argument("--kv-bytes-per-token", type=int, default=None, metavar="K",
                     help="KV-cache bytes per token (per rank with --tp): report how many "
                     "tokens of KV cache fit in what the arena leaves")
    fit.add_argument("--max-batch-tokens", type=int, default=None, metavar="M",
                     help="do not search: the arena at this M (default: the largest that fits)")
    _limit_args(fit)
    _buffer_args(fit)
    fit.add_argument("--reserve", action="store_true",
                     help="size a reserved arena (stable addresses): each buffer rounded up to "
                     "--granularity")
    fit.add_argument("--granularity", metavar="SIZE", default=None,
                     help="allocation granularity of a reserved arena (default with --reserve: "
                     "2MiB, CUDA's on H100/H200)")
    fit.add_argument("--debug", action="store_true",
                     help="size a debug arena: a guard band after every live buffer")
    fit.add_argument("--guard-bytes", type=int, default=None, metavar="N",
                     help="guard bytes of --debug (default: 4096; implies --debug)")
    fit.add_argument("--json", action="store_true", help="machine-readable output")
    fit.add_argument("--explain", action="store_true",
                     help="also say which buffers dominate the arena's growth with M")


def _mib(n):
    return f"{n / 1048576:,.2f}"


def _lever_report(config, sizes, limits, target, env, tp):
    """Each lever in effect, how it was set and what it changed: the sizes
    are computed again without it and compared buffer by buffer."""
    out = []
    for name, how in sizes.levers().items():
        cfg, without = config, {k: v for k, v in env.items() if k != name}
        if how == "quantization_config":
            cfg = config.replace(quantization="")
        base = BufferSizes.from_config(cfg, *limits, target=target, env=without, tp_size=tp,
                                       buffers=sizes.buffers)
        changed = {n: [base[n], sizes[n]] for n in sizes if base[n] != sizes[n]}
        out.append({"lever": name, "value": how,
                    "source": "quantization_config" if how == "quantization_config" else "environment",
                    "changed": changed})
    return out


def _quantization_report(config):
    """What the config's quantization_config did to the plan: the lever it
    stands for, or nothing (no buffer of this reference depends on it)."""
    if not config.quantization:
        return None
    from metrale.levers import quantization_levers
    levers = quantization_levers(config)
    return {"method": config.quantization, "levers": list(levers),
            "used": bool(levers)}


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
    from metrale.errors import ConfigWarning
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


class _Planned:
    """What one ``metrale plan`` computes, as typed objects: the dict of
    ``--json`` and the picture of ``--svg`` are both read from it."""

    __slots__ = ("model", "config", "notes", "target", "buffers", "set_record", "sizes",
                 "layout")

    def __init__(self, args):
        from metrale._layout import plan_layout
        (self.config, self.notes), self.target = _model(args), _target(args)
        self.buffers, self.set_record = _buffer_set(args)
        self.model = args.preset or args.config      # as the reader named it
        self.sizes = BufferSizes.from_config(self.config, args.max_batch_tokens,
                                             args.max_seq_len, args.kv_block_size,
                                             args.max_batch_size, target=self.target,
                                             env=os.environ, tp_size=args.tp,
                                             buffers=self.buffers)
        self.layout = plan_layout(self.sizes, args.max_batch_tokens)


def plan(args):
    """The plan of `metrale plan` as a JSON-ready dict.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``metrale plan`` arguments (see ``metrale plan --help``).

    Returns
    -------
    dict
        Model, limits, target, levers in effect, quantization, the buffer
        set (``--buffers`` less ``--drop``: its fingerprint and names), each
        buffer (bytes, offset, helpers), the zeroing ranges and the slab
        size; with ``--allocate``, what the host backend did.

    Raises
    ------
    ValueError, TypeError, OSError
        A bad limit, config file, buffers file, ``--drop`` name or option.
    MetraleError, MemoryError
        ``--allocate`` failed.
    """
    with _SpecErrors(args):
        return _report(args, _Planned(args))


def _report(args, planned):
    from metrale.catalogue import membership

    config, target, sizes, layout = planned.config, planned.target, planned.sizes, planned.layout
    limits = (args.max_batch_tokens, args.max_seq_len, args.kv_block_size, args.max_batch_size)
    rank_config = config.shard(args.tp)
    offsets = layout.offsets
    rows = []
    for name in layout.slab_order:
        n = sizes[name]
        m = membership(name, buffers=planned.buffers)
        # zero_all_rows covers every zero_all buffer: the token-major ones
        # trimmed to the live rows ("rows"), the others whole ("rows:whole").
        groups = [g for g, on in (("zero_all", m["zero_all"]),
                                  ("prefill", m["zero_prefill_essentials"]),
                                  ("rows", m["zero_all_rows"] == "trimmed"),
                                  ("rows:whole", m["zero_all_rows"] == "whole"),
                                  ("checksum", m["checksum"])) if on]
        rows.append({"buffer": name, "bytes": n, "offset": offsets[name],
                     "groups": groups, "null": n == 0})
    result = {
        "model": planned.model,
        "model_type": config.model_type,
        "config_warnings": planned.notes,
        "tp_size": args.tp,
        "buffer_set": planned.set_record,
        "max_batch_tokens": args.max_batch_tokens, "max_seq_len": args.max_seq_len,
        "kv_block_size": args.kv_block_size, "max_batch_size": args.max_batch_size,
        "target": {"sm_count": target.sm_count, "splitk": target.splitk,
                   "splitk_switched": args.sm_count is not None and args.splitk is None},
        "levers": _lever_report(config, sizes, limits, target, os.environ, args.tp),
        "quantization": _quantization_report(config),
        "buffers": rows,
        "total_bytes": sizes.total_bytes(),
        "not_in_total": [n for n in sizes if not planned.buffers[n].total],
        "slab_bytes": layout.slab_bytes,
        "zero_all": dict(zip(("offset", "length"), layout.zero_all)),
        "zero_prefill": dict(zip(("offset", "length"), layout.zero_prefill)),
        "zero_all_rows": {"tokens": args.tokens,
                          "ranges": [{"offset": o, "length": n}
                                     for o, n in layout.rows_ranges(args.tokens)]},
        "null_buffers": [n for n in sizes if sizes[n] == 0],
    }
    if args.allocate:
        from metrale import BufferArena, HostBackend
        gpu = HostBackend()
        with BufferArena.from_sizes(rank_config, sizes, args.max_batch_tokens,
                                    args.max_batch_size, gpu) as arena:
            before = gpu.memset_count
            arena.zero_all(gpu, 0)
            result["allocated"] = {"backend": "host", "slab_bytes": arena.slab_bytes(),
                                   "allocations": gpu.alloc_count,
                                   "zero_all_operations": gpu.memset_count - before,
                                   "fingerprint": arena.sizes().buffers.fingerprint()}
    return result


def _picture(args, planned):
    """The SVG of ``--svg``: the typed plan, drawn."""
    from metrale.picture import render_svg
    if not planned.layout.slab_bytes:
        raise ValueError(f"--svg {args.svg}: the set places no buffer in the slab (every "
                         "size is 0): nothing to draw")
    return render_svg(planned.layout, planned.sizes, target=planned.target, tokens=args.tokens,
                      model=planned.model, model_type=planned.config.model_type)


def _explain(args, planned):
    """The catalogue entry of one buffer, evaluated for this plan's model,
    limits and target."""
    from metrale.catalogue import explain
    config = planned.config.shard(args.tp)   # the formula, evaluated for one rank
    try:
        planned.buffers.index(args.explain)
    except ValueError as e:             # names near matches
        raise ValueError(f"--explain: {e}") from None
    return explain(args.explain, planned.sizes, config, max_batch_tokens=args.max_batch_tokens,
                   max_seq_len=args.max_seq_len, kv_block_size=args.kv_block_size,
                   max_batch_size=args.max_batch_size, target=planned.target,
                   buffers=planned.buffers)


def _print(result, out):
    w = out.write
    t = result["target"]
    tp = f" tp_size={result['tp_size']} (per rank)" if result["tp_size"] > 1 else ""
    w(f"metrale plan: {result['model']} ({result['model_type'] or '?'}), "
      f"max_batch_tokens={result['max_batch_tokens']} max_seq_len={result['max_seq_len']} "
      f"kv_block_size={result['kv_block_size']} max_batch_size={result['max_batch_size']} "
      f"target={t['sm_count']} SMs/{t['splitk']}{tp}\n")
    for note in result["config_warnings"]:
        w(f"config: not understood: {note['message']}\n")
    if result["buffer_set"]["file"] or result["buffer_set"]["dropped"]:
        w(_set_line(result["buffer_set"]) + "\n")
    if t["splitk_switched"]:
        w("note: --sm-count switched the split-K policy from the reference's 'legacy' to "
          "'auto' (pass --splitk to choose)\n")
    for lv in result["levers"]:
        what = ", ".join(f"{n} {a:,} -> {b:,} bytes ({'+' if b >= a else '-'}{_mib(abs(b - a))} MiB)"
                         for n, (a, b) in lv["changed"].items()) or "no size changed"
        how = (f"{lv['lever']}={lv['value']}" if lv["source"] == "environment"
               else f"{lv['lever']} on (from quantization_config)")
        w(f"lever: {how}: {what}\n")
    q = result["quantization"]
    if q is not None:
        if q["used"]:
            w(f"quantization_config: {q['method']}: turns on {', '.join(q['levers'])} "
              "(the environment variable, when set, decides instead)\n")
        else:
            w(f"quantization_config: {q['method']}: ignored (no buffer of this plan depends "
              "on it)\n")
    if not result["levers"]:
        w("levers: none in effect (see metrale plan --help)\n")
    w("\n")
    w(f"{'buffer':<22} {'bytes':>16} {'MiB':>11} {'offset':>16}  groups\n")
    for r in result["buffers"]:
        off = "NULL" if r["null"] else f"{r['offset']:,}"
        w(f"{r['buffer']:<22} {r['bytes']:>16,} {_mib(r['bytes']):>11} {off:>16}  "
          f"{','.join(r['groups'])}\n")
    za, zp = result["zero_all"], result["zero_prefill"]
    w("\n")
    w(f"zero_all:                one range, offset {za['offset']:,}, {za['length']:,} bytes\n")
    w(f"zero_prefill_essentials: one range, offset {zp['offset']:,}, {zp['length']:,} bytes\n")
    w(f"NULL buffers ({len(result['null_buffers'])}): {', '.join(result['null_buffers']) or '-'}\n")
    left = result["not_in_total"]
    but = (", ".join(left[:-1]) + " and " if len(left) > 1 else "") + (left[-1] if left else "")
    w(f"total_bytes(): {result['total_bytes']:,} ({_mib(result['total_bytes'])} MiB; "
      + (f"all but {but}" if 0 < len(left) <= 4 else f"all but {len(left)} buffers" if left
         else "every buffer") + ")\n")
    w(f"slab:          {result['slab_bytes']:,} ({_mib(result['slab_bytes'])} MiB, one allocation)\n")
    if "allocated" in result:
        a = result["allocated"]
        w(f"allocated on the host backend: {a['slab_bytes']:,} bytes in {a['allocations']} "
          f"allocation; zero_all issued {a['zero_all_operations']} operation\n")


def fit_answer(args):
    """The answer of `metrale fit` as a JSON-ready dict.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``metrale fit`` arguments (see ``metrale fit --help``).

    Returns
    -------
    dict
        Model, target, levers in effect, the buffer set, where the budget
        came from, the fields of `metrale.fitting.ArenaFit`, and with
        ``--explain`` the growth of the arena and of each buffer with
        max_batch_tokens.

    Raises
    ------
    ValueError, TypeError, OSError
        A bad size, limit, config file, buffers file, ``--drop`` name or
        option; a budget the smallest arena does not fit; or a set with a
        size not seen to grow with max_batch_tokens (without
        ``--max-batch-tokens``).
    """
    with _SpecErrors(args):
        return _fit_answer(args)


def _fit_answer(args):
    from metrale._math import U64_MAX
    from metrale.fitting import fit, growth, growth_span, parse_size

    (config, notes), target = _model(args), _target(args)
    buffers, set_record = _buffer_set(args)
    if args.budget is not None:
        if args.weights is not None:
            raise ValueError("--weights goes with --gpu-mem (the budget is their difference); "
                             "with --budget, leave it out")
        budget = parse_size(args.budget, "--budget")
        source = {"budget": budget}
    else:
        gpu_mem = parse_size(args.gpu_mem, "--gpu-mem")
        weights = 0 if args.weights is None else parse_size(args.weights, "--weights")
        if weights >= gpu_mem:
            raise ValueError(f"--weights: {weights:,} bytes leave nothing of --gpu-mem "
                             f"({gpu_mem:,} bytes)")
        budget = gpu_mem - weights
        source = {"gpu_mem": gpu_mem, "weights": weights}
    debug = None
    if args.debug or args.guard_bytes is not None:
        from metrale.debug import DebugOptions
        debug = DebugOptions() if args.guard_bytes is None else DebugOptions(args.guard_bytes)
    granularity = None
    if args.reserve:
        granularity = "2MiB" if args.granularity is None else args.granularity
    elif args.granularity is not None:
        raise ValueError("--granularity goes with --reserve")
    env = os.environ
    sizing = dict(tp_size=args.tp, env=env, target=target, buffers=buffers)
    limits = (args.max_seq_len, args.kv_block_size, args.max_batch_size)
    result = fit(config, budget, *limits, reserve=args.reserve, debug=debug,
                 granularity=granularity, max_batch_tokens=args.max_batch_tokens,
                 kv_bytes_per_token=args.kv_bytes_per_token, **sizing)
    m = result.max_batch_tokens
    sizes = BufferSizes.from_config(config, m, *limits, **sizing)
    answer = {
        "model": args.preset or args.config,
        "model_type": config.model_type,
        "config_warnings": notes,
        "target": {"sm_count": target.sm_count, "splitk": target.splitk,
                   "splitk_switched": args.sm_count is not None and args.splitk is None},
        "levers": sizes.levers(),
        "buffer_set": set_record,
        "budget_from": source,
        "fit": {name: getattr(result, name) for name in result.__slots__},
    }
    if args.explain:
        lo, hi = growth_span(m)
        arena = [fit(config, U64_MAX, *limits, reserve=args.reserve, debug=debug,
                     granularity=granularity, max_batch_tokens=k, **sizing).arena_bytes
                 for k in (lo, hi)]
        answer["explain"] = {
            "from_max_batch_tokens": lo, "to_max_batch_tokens": hi,
            "arena_bytes": arena,
            "buffers": [{"buffer": n, "bytes": [a, b]}
                        for n, a, b in growth(config, m, *limits, **sizing)],
        }
    return answer


def _print_fit(answer, out):
    w = out.write
    t = answer["target"]
    w(f"metrale fit: {answer['model']} ({answer['model_type'] or '?'}), "
      f"target={t['sm_count']} SMs/{t['splitk']}\n")
    for note in answer["config_warnings"]:
        w(f"config: not understood: {note['message']}\n")
    if t["splitk_switched"]:
        w("note: --sm-count switched the split-K policy from the reference's 'legacy' to "
          "'auto' (pass --splitk to choose)\n")
    if answer["buffer_set"]["file"] or answer["buffer_set"]["dropped"]:
        w(_set_line(answer["buffer_set"]) + "\n")
    src = answer["budget_from"]
    if "gpu_mem" in src:
        w(f"budget: --gpu-mem {src['gpu_mem']:,} less --weights {src['weights']:,} bytes\n")
    w("levers: " + (", ".join(f"{k}={v}" for k, v in answer["levers"].items())
                    or "none in effect (see metrale fit --help)") + "\n")
    from metrale.fitting import ArenaFit
    w(f"{ArenaFit(**answer['fit'])}\n")
    ex = answer.get("explain")
    if ex is None:
        return
    lo, hi = ex["from_max_batch_tokens"], ex["to_max_batch_tokens"]
    span = hi - lo
    a0, a1 = ex["arena_bytes"]
    w(f"\ngrowth from max_batch_tokens={lo:,} to {hi:,}: the arena "
      f"{(a1 - a0) / span:,.1f} bytes per token\n")
    grown = sum(b - a for a, b in (r["bytes"] for r in ex["buffers"]))
    for r in ex["buffers"][:8]:
        a, b = r["bytes"]
        w(f"  {r['buffer']:<22} {(b - a) / span:>14,.1f} bytes/token  "
          f"{100 * (b - a) / grown:5.1f} %\n")
    rest = ex["buffers"][8:]
    if rest:
        w(f"  ... {len(rest)} more growing buffer(s), "
          f"{100 * sum(b - a for a, b in (r['bytes'] for r in rest)) / grown:.1f} %\n")
    if ex["buffers"]:
        top = ex["buffers"][0]
        a, b = top["bytes"]
        w(f"dominant: {top['buffer']} ({100 * (b - a) / grown:.1f} % of the buffers' growth)\n")


def _fit_main(args):
    """`metrale fit`: compute, then print; the statuses of `main`."""
    try:
        answer = fit_answer(args)
    except (ValueError, TypeError, OSError) as e:
        return _fail(e, USAGE)
    except (MetraleError, MemoryError) as e:
        return _fail(e, RUNTIME)
    try:
        if args.json:
            json.dump(answer, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            _print_fit(answer, sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:
        return _closed_pipe()
    return 0


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


def main(argv=None):
    """Run the ``metrale`` command line.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments; None reads ``sys.argv``.

    Returns
    -------
    int
        The exit status: 0 (also when the reader of stdout left early, a
        closed pipe), 1 for a failure while running (an allocation refused),
        2 for a usage error (a flag, a value, the config file, or with
        ``--strict`` a config key not understood).  Errors are one line on
        stderr.
    """
    try:
        try:
            args = _parser().parse_args(argv)
        except _UsageError as e:
            return _fail(f"{e} (see metrale --help)", USAGE)
        except SystemExit as e:              # --help
            return e.code if isinstance(e.code, int) else 0
        if args.command == "fit":
            return _fit_main(args)
        try:
            with _SpecErrors(args):
                planned = _Planned(args)
                result = _report(args, planned)
            text = _explain(args, planned) if args.explain else None
            if args.svg:
                svg = _picture(args, planned)
                with open(args.svg, "w", encoding="utf-8") as f:
                    f.write(svg)
        except (ValueError, TypeError, OSError) as e:
            return _fail(e, USAGE)
        except (MetraleError, MemoryError) as e:
            return _fail(e, RUNTIME)
        try:
            if text is not None:
                sys.stdout.write(text + "\n")
            elif args.json:
                json.dump(result, sys.stdout, indent=2)
                sys.stdout.write("\n")
            else:
                _print(result, sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:
            return _closed_pipe()
    except KeyboardInterrupt:
        return 130
    return 0
