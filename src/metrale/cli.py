"""`metrale plan`: the arena ledger of a model, on the host backend (no GPU)."""

import argparse
import json
import os
import sys

from metrale.config import ModelConfig
from metrale.errors import MetraleError
from metrale.sizes import BUFFER_NAMES, SPLITK_POLICIES, BufferSizes, Target

# Exit statuses: 2 for what the user typed (flags, values, the config file),
# 1 for what failed while running (an allocation refused, a driver error).
USAGE, RUNTIME = 2, 1


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    # argparse prints the usage and exits; metrale prints one line and returns 2.
    def error(self, message):
        raise _UsageError(message)


def _parser():
    p = _Parser(prog="metrale", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="print the buffer ledger of an arena")
    src = plan.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", choices=ModelConfig.presets(), help="a bundled model shape")
    src.add_argument("--config", metavar="PATH", help="a Hugging Face config.json (or its directory)")
    plan.add_argument("--max-batch-tokens", type=int, default=8192, metavar="M")
    plan.add_argument("--max-seq-len", type=int, default=4096)
    plan.add_argument("--kv-block-size", type=int, default=16)
    plan.add_argument("--max-batch-size", type=int, default=32)
    plan.add_argument("--sm-count", type=int, default=None,
                      help="size for a device with this many SMs (default: the reference target)")
    plan.add_argument("--splitk", default=None, choices=SPLITK_POLICIES, metavar="{legacy,auto,1..16}",
                      help="split-K policy")
    plan.add_argument("--tokens", type=int, default=1, metavar="T",
                      help="live tokens for the zero_all_rows(T) ranges reported (default: %(default)s)")
    plan.add_argument("--allocate", action="store_true",
                      help="also build the arena on the host backend and zero it")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _mib(n):
    return f"{n / 1048576:,.2f}"


def plan(args):
    from metrale._layout import plan_layout

    config = (ModelConfig.preset(args.preset) if args.preset
              else ModelConfig.from_hf_config(args.config))
    ref = Target.reference()
    target = Target(ref.sm_count if args.sm_count is None else args.sm_count,
                    args.splitk or ("auto" if args.sm_count is not None else ref.splitk))
    sizes = BufferSizes.from_config(config, args.max_batch_tokens, args.max_seq_len,
                                    args.kv_block_size, args.max_batch_size, target=target)
    layout = plan_layout(sizes, args.max_batch_tokens)
    offsets = layout.offsets
    rows = []
    for name in layout.slab_order:
        n = getattr(sizes, name)
        groups = [g for g, members in layout.groups.items() if name in members]
        rows.append({"buffer": name, "bytes": n, "offset": offsets[name],
                     "groups": groups, "null": n == 0})
    result = {
        "model": args.preset or args.config,
        "model_type": config.model_type,
        "max_batch_tokens": args.max_batch_tokens, "max_seq_len": args.max_seq_len,
        "kv_block_size": args.kv_block_size, "max_batch_size": args.max_batch_size,
        "target": {"sm_count": target.sm_count, "splitk": target.splitk},
        "buffers": rows,
        "total_bytes": sizes.total_bytes(),
        "slab_bytes": layout.slab_bytes,
        "zero_all": dict(zip(("offset", "length"), layout.zero_all)),
        "zero_prefill": dict(zip(("offset", "length"), layout.zero_prefill)),
        "zero_all_rows": {"tokens": args.tokens,
                          "ranges": [{"offset": o, "length": n}
                                     for o, n in layout.rows_ranges(args.tokens)]},
        "null_buffers": [n for n in BUFFER_NAMES if getattr(sizes, n) == 0],
    }
    if args.allocate:
        from metrale import BufferArena, HostBackend
        gpu = HostBackend()
        with BufferArena.from_sizes(config, sizes, args.max_batch_tokens,
                                    args.max_batch_size, gpu) as arena:
            before = gpu.memset_count
            arena.zero_all(gpu, 0)
            result["allocated"] = {"backend": "host", "slab_bytes": arena.slab_bytes(),
                                   "allocations": gpu.alloc_count,
                                   "zero_all_operations": gpu.memset_count - before}
    return result


def _print(result, out):
    w = out.write
    w(f"metrale plan: {result['model']} ({result['model_type'] or '?'}), "
      f"max_batch_tokens={result['max_batch_tokens']} max_seq_len={result['max_seq_len']} "
      f"kv_block_size={result['kv_block_size']} max_batch_size={result['max_batch_size']} "
      f"target={result['target']['sm_count']} SMs/{result['target']['splitk']}\n\n")
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
    w(f"total_bytes(): {result['total_bytes']:,} ({_mib(result['total_bytes'])} MiB; "
      "all but o_latent and norm_unit_w)\n")
    w(f"slab:          {result['slab_bytes']:,} ({_mib(result['slab_bytes'])} MiB, one allocation)\n")
    if "allocated" in result:
        a = result["allocated"]
        w(f"allocated on the host backend: {a['slab_bytes']:,} bytes in {a['allocations']} "
          f"allocation; zero_all issued {a['zero_all_operations']} operation\n")


def _fail(message, status):
    # One line, whatever the message holds.
    print("metrale: error: " + " ".join(str(message).split()), file=sys.stderr)
    return status


def main(argv=None):
    """Run the CLI; returns the exit status (0, 1 runtime failure, 2 usage)."""
    try:
        try:
            args = _parser().parse_args(argv)
        except _UsageError as e:
            return _fail(f"{e} (see metrale --help)", USAGE)
        except SystemExit as e:              # --help
            return e.code if isinstance(e.code, int) else 0
        try:
            result = plan(args)
        except (ValueError, TypeError, OSError) as e:
            return _fail(e, USAGE)
        except (MetraleError, MemoryError) as e:
            return _fail(e, RUNTIME)
        try:
            if args.json:
                json.dump(result, sys.stdout, indent=2)
                sys.stdout.write("\n")
            else:
                _print(result, sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader left (`metrale plan ... | head -1`): end quietly.  Point
            # stdout at devnull so the flush at exit cannot raise again.
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):
                pass
            return RUNTIME
    except KeyboardInterrupt:
        return 130
    return 0
