"""``python -m shardspec.conformance``: check implementations against the spec.

Exit code 0 when every MUST invariant holds, every case ran and no rank
failed; 1 otherwise; 2 for a usage error. SHOULD violations are warnings.
Options may also come from the environment (``SHARDSPEC_IMPL``,
``SHARDSPEC_IMPL_ODD``, ``SHARDSPEC_TP``, ``SHARDSPEC_QUICK``,
``SHARDSPEC_MAX_EXAMPLES``, ``SHARDSPEC_MIXED_MAX_EXAMPLES``, ``SHARDSPEC_SEED``, ``SHARDSPEC_TIMEOUT``,
``SHARDSPEC_XFAILS``); a command-line option wins.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from typing import Optional

import torch

from shardspec.conformance.api import IMPL_ENV, ImplementationError, implementation_names
from shardspec.conformance.runner import IN_PROCESS_GROUPS, RunConfig

QUICK_TP_SIZES = [2, 4]
QUICK_MAX_EXAMPLES = 10
MIXED_MAX_EXAMPLES = 25


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m shardspec.conformance", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", help="entries, comma-separated; each an implementation (reference (default), "
                        "production, or package.module:attr) or A/B: even ranks run A, odd ranks B "
                        f"[env {IMPL_ENV}]")
    parser.add_argument("--impl-odd", default=os.environ.get("SHARDSPEC_IMPL_ODD"),
                        help="turn every entry A into the mixed entry A/IMPL_ODD")
    parser.add_argument("--tp", default=os.environ.get("SHARDSPEC_TP"), help="group sizes, e.g. 1,2,3,4,8")
    parser.add_argument("--quick", action="store_true", default=_env_flag("SHARDSPEC_QUICK"),
                        help=f"tp {','.join(map(str, QUICK_TP_SIZES))}, {QUICK_MAX_EXAMPLES} generated cases per size")
    parser.add_argument("--max-examples", type=int, default=_env_int("SHARDSPEC_MAX_EXAMPLES"),
                        help="generated cases per group size (default 100)")
    parser.add_argument("--mixed-max-examples", type=int, default=_env_int("SHARDSPEC_MIXED_MAX_EXAMPLES"),
                        help=f"generated cases per group size of a mixed entry A/B (default {MIXED_MAX_EXAMPLES}, "
                        "never more than --max-examples)")
    parser.add_argument("--seed", type=int, default=_env_int("SHARDSPEC_SEED") or 0)
    parser.add_argument("--fixtures-only", action="store_true", help="only the golden fixtures")
    parser.add_argument("--case", action="append", default=[], metavar="ID", help="run this fixture case only")
    parser.add_argument("--case-file", action="append", default=[], metavar="PATH", help="run this case file only")
    parser.add_argument("--json", metavar="PATH", help="write the JSON report here")
    parser.add_argument("--xfails-file", default=os.environ.get("SHARDSPEC_XFAILS"),
                        help="invariant IDs or case ids expected to fail (YAML list/mapping, or one per line)")
    parser.add_argument("--timeout", type=float, default=float(os.environ.get("SHARDSPEC_TIMEOUT", 60)),
                        help="seconds a case may take on a rank before it counts as hung (default 60)")
    parser.add_argument("--pg-timeout", type=float, default=None,
                        help="process-group timeout in seconds (default: --timeout)")
    parser.add_argument("--in-process", action="store_true",
                        help="all ranks as threads of this process, taking turns (see --in-process-group)")
    parser.add_argument("--in-process-group", choices=list(IN_PROCESS_GROUPS), default=None,
                        help="implies --in-process. lockstep (default): shardspec's own group, for implementations "
                             "that use only the comm they are given; torch-threads: a torch.distributed group of "
                             "torch's threaded backend, also for implementations that call torch.distributed")
    parser.add_argument("--in-process-device", choices=["auto", "cpu", "cuda"],
                        default=os.environ.get("SHARDSPEC_IN_PROCESS_DEVICE", "auto"),
                        help="where in-process runs (and shrinking) put the ranks: cuda (one GPU, ranks take "
                             "turns, compiled kernels), cpu, or auto: cuda where there is a GPU (default)")
    parser.add_argument("--launcher", choices=["auto", "torchrun", "fork"],
                        default=os.environ.get("SHARDSPEC_LAUNCHER", "auto"),
                        help="how rank processes start: torchrun, fork of one preloaded process (CPU only), "
                             "or auto: fork on the CPU, torchrun on GPUs (default)")
    parser.add_argument("--run-dir", type=pathlib.Path, help="keep the run's files here")
    parser.add_argument("--no-shrink", action="store_true", help="do not shrink failing generated cases")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    return parser


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    return int(value) if value else None


def config_from_args(args: argparse.Namespace) -> RunConfig:
    tp_sizes = QUICK_TP_SIZES if args.quick else [1, 2, 3, 4, 8]
    if args.tp:
        tp_sizes = sorted({int(part) for part in str(args.tp).split(",") if part.strip()})
    max_examples = args.max_examples if args.max_examples is not None else (
        QUICK_MAX_EXAMPLES if args.quick else 100)
    mixed_max_examples = min(max_examples, MIXED_MAX_EXAMPLES if args.mixed_max_examples is None
                             else args.mixed_max_examples)
    return RunConfig(
        impls=implementation_names(args.impl, args.impl_odd), tp_sizes=tp_sizes, seed=args.seed,
        max_examples=max_examples, mixed_max_examples=mixed_max_examples, fixtures_only=args.fixtures_only, case_ids=args.case,
        case_files=args.case_file, case_timeout_s=args.timeout,
        pg_timeout_s=args.pg_timeout or args.timeout, in_process=args.in_process or args.in_process_group is not None,
        in_process_group=args.in_process_group or "lockstep", launcher=args.launcher,
        run_dir=args.run_dir,
        shrink=not args.no_shrink, verbose=args.verbose,
    )


def main(argv: Optional[list[str]] = None) -> int:
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel is defined
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.in_process_device == "cuda" and not torch.cuda.is_available():
        parser.error("--in-process-device cuda: no CUDA device is available")
    os.environ["SHARDSPEC_IN_PROCESS_DEVICE"] = args.in_process_device  # read by the in-process runner
    try:
        config = config_from_args(args)
    except (ImplementationError, ValueError) as exc:
        parser.error(str(exc))
    from shardspec.conformance.session import ConformanceSession

    session = ConformanceSession(config, log=_log)
    session.run_all()
    return session.finish(json_path=args.json, xfails_file=args.xfails_file)


def _log(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())

