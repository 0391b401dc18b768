"""`metrale plan`: the arena ledger of a model, on the host backend (no GPU); `metrale fit`:
the largest max_batch_tokens whose arena fits a memory budget."""
# The docstring is `metrale --help`'s description.  `plan` and main are here,
# `fit` in _cli_fit.py, the arguments and statuses both take in _cli_common.py.

import argparse
import json
import os
import sys

from .._version import __version__
from ._cli_common import (RUNTIME, USAGE, _buffer_args, _buffer_set, _closed_pipe, _fail,
                          _levers_help, _limit_args, _mib, _model, _model_args, _set_line,
                          _SpecErrors, _svg_clash, _svg_out, _target)
from ._cli_fit import _fit_main, _fit_parser
from ._cli_fit import fit_answer  # noqa: F401  (public: metrale.cli.fit_answer)
from .._base.errors import MetraleError
from .._sizing.sizes import BufferSizes


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    # argparse prints the usage and exits; metrale prints one line and returns 2.
    def error(self, message):
        raise _UsageError(message)


def _parser():
    p = _Parser(prog="metrale", description=__doc__)
    p.add_argument("--version", action="version", version=f"metrale {__version__}")
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
                      help="also draw the slab to scale, with the zeroing ranges, as SVG; "
                      "'-' writes the SVG to stdout instead of the ledger")
    _fit_parser(sub)
    return p


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
    from .._sizing.levers import quantization_levers
    levers = quantization_levers(config)
    return {"method": config.quantization, "levers": list(levers),
            "used": bool(levers)}


class _Planned:
    """What one ``metrale plan`` computes, as typed objects: the dict of
    ``--json`` and the picture of ``--svg`` are both read from it."""

    __slots__ = ("model", "config", "notes", "target", "buffers", "set_record", "sizes",
                 "layout")

    def __init__(self, args):
        from .._sizing._layout import plan_layout
        (self.config, self.notes), self.target = _model(args), _target(args)
        self.buffers, self.set_record = _buffer_set(args)
        self.model = args.preset or args.config      # as the reader named it
        self.sizes = BufferSizes.from_config(self.config, args.max_batch_tokens,
                                             args.max_seq_len, args.kv_block_size,
                                             args.max_batch_size, target=self.target,
                                             env=os.environ, tp_size=args.tp,
                                             buffers=self.buffers)
        self.layout = plan_layout(self.sizes)


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
    from .._sizing.catalogue import membership

    config, target, sizes, layout = planned.config, planned.target, planned.sizes, planned.layout
    limits = (args.max_batch_tokens, args.max_seq_len, args.kv_block_size, args.max_batch_size)
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
        from .._arena._buffer_arena import BufferArena
        from .._backends._host_backend import HostBackend
        gpu = HostBackend()
        with BufferArena.from_sizes(sizes, gpu) as arena:
            before = gpu.memset_count
            arena.zero_all(gpu, 0)
            result["allocated"] = {"backend": "host", "slab_bytes": arena.slab_bytes(),
                                   "allocations": gpu.alloc_count,
                                   "zero_all_operations": gpu.memset_count - before,
                                   "fingerprint": arena.sizes().buffers.fingerprint()}
    return result


def _picture(args, planned):
    """The SVG of ``--svg``: the typed plan, drawn."""
    from .._integrations.picture import render_svg
    if not planned.layout.slab_bytes:
        raise ValueError(f"--svg {args.svg}: the set places no buffer in the slab (every "
                         "size is 0): nothing to draw")
    return render_svg(planned.layout, tokens=args.tokens, model=planned.model)


def _explain(args, planned):
    """The catalogue entry of one buffer, evaluated for this plan's model,
    limits and target."""
    from .._sizing.catalogue import explain
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
        clash = _svg_clash(args)
        if clash is not None:
            return clash
        try:
            with _SpecErrors(args):
                planned = _Planned(args)
                result = _report(args, planned)
            text = _explain(args, planned) if args.explain else None
            svg = _svg_out(args.svg, _picture(args, planned)) if args.svg else None
        except (ValueError, TypeError, OSError) as e:
            return _fail(e, USAGE)
        except (MetraleError, MemoryError) as e:
            return _fail(e, RUNTIME)
        try:
            if svg is not None:             # --svg -: stdout carries the picture alone
                sys.stdout.write(svg)
            elif text is not None:
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
