"""`metrale fit`: the largest max_batch_tokens whose arena fits a memory
budget; its arguments, its answer and how it is printed."""

import argparse
import json
import os
import sys

from ._cli_common import (RUNTIME, USAGE, _buffer_args, _buffer_set, _closed_pipe, _fail,
                          _levers_help, _limit_args, _model, _model_args, _set_line,
                          _SpecErrors, _svg_clash, _svg_out, _target)
from .._base.errors import MetraleError
from .._sizing.sizes import BufferSizes

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
    fit.add_argument("--torch-pool", metavar="SIZE", default=None,
                     help="with --reserve: set aside the arena's pool for torch's memory "
                     "(metrale.torch.pool(arena, SIZE)) before sizing the arena")
    fit.add_argument("--debug", action="store_true",
                     help="size a debug arena: a guard band after every live buffer")
    fit.add_argument("--guard-bytes", type=int, default=None, metavar="N",
                     help="guard bytes of --debug (default: 4096; implies --debug)")
    fit.add_argument("--json", action="store_true", help="machine-readable output")
    fit.add_argument("--explain", action="store_true",
                     help="also say which buffers dominate the arena's growth with M")
    fit.add_argument("--svg", metavar="FILE",
                     help="also draw the split of the device's memory (weights, arena, pool, "
                     "KV cache, headroom) as a bar, as SVG; '-' writes the SVG to stdout "
                     "instead of the answer")


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
    from .._base._math import U64_MAX
    from .._integrations.fitting import fit, growth, growth_span, parse_size

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
        from .._sizing.debug import DebugOptions
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
                 kv_bytes_per_token=args.kv_bytes_per_token,
                 torch_pool_bytes=args.torch_pool, **sizing)
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
    from .._integrations.fitting import ArenaFit
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


def _fit_picture(answer):
    """The SVG of ``--svg``: the answer's split of the device's memory, drawn."""
    from .._integrations.fitting import ArenaFit
    from .._integrations.picture import fit_svg
    return fit_svg(ArenaFit(**answer["fit"]), weights=answer["budget_from"].get("weights", 0),
                   model=answer["model"])


def _fit_main(args):
    """`metrale fit`: compute, then print; the statuses of `main`."""
    clash = _svg_clash(args)
    if clash is not None:
        return clash
    try:
        answer = fit_answer(args)
        svg = _svg_out(args.svg, _fit_picture(answer)) if args.svg else None
    except (ValueError, TypeError, OSError) as e:
        return _fail(e, USAGE)
    except (MetraleError, MemoryError) as e:
        return _fail(e, RUNTIME)
    try:
        if svg is not None:             # --svg -: stdout carries the picture alone
            sys.stdout.write(svg)
        elif args.json:
            json.dump(answer, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            _print_fit(answer, sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:
        return _closed_pipe()
    return 0
