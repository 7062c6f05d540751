"""``python -m shardspec.conformance``: check implementations against the spec.

A thin wrapper over pytest with the suite's plugin (:mod:`shardspec.conformance.plugin`):
``--impl X`` is the plugin's ``--shardspec-impl X``, and so on for every option;
arguments after ``--`` go to pytest (e.g. ``-- -k INV-OWNER --junitxml=j.xml``).
Exit code 0 when every MUST invariant holds, every case ran and no rank
failed; 1 otherwise (a run that judged no case included); 2 for a usage
error, reported in one line before anything is launched; 130/143 after
SIGINT/SIGTERM, with a partial report. SHOULD violations are warnings.
Options may also come from the environment (``SHARDSPEC_IMPL``,
``SHARDSPEC_IMPL_ODD``, ``SHARDSPEC_TP``, ``SHARDSPEC_QUICK``,
``SHARDSPEC_MAX_EXAMPLES``, ``SHARDSPEC_MIXED_MAX_EXAMPLES``, ``SHARDSPEC_SEED``,
``SHARDSPEC_TIMEOUT``, ``SHARDSPEC_XFAILS``); a command-line option wins, and a
variable that an option overrides is not read.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

from shardspec.conformance.api import ImplementationError, implementation_names
from shardspec.conformance.options import THREAD_GROUPS, UsageError, resolve

# Light imports only: the pytest plugin imports this module in every pytest session of an environment
# where shardspec is installed; torch and the suite load when a run starts.


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m shardspec.conformance",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--impl",
        help="entries, comma-separated; each an implementation (reference (default), "
        "production, or package.module:attr) or A/B: even ranks run A, odd ranks B "
        "[env SHARDSPEC_IMPL]",
    )
    parser.add_argument(
        "--impl-odd", help="turn every entry A into the mixed entry A/IMPL_ODD [env SHARDSPEC_IMPL_ODD]"
    )
    parser.add_argument("--tp", help="group sizes, e.g. 1,2,3,4,8 [env SHARDSPEC_TP]")
    parser.add_argument(
        "--profile",
        help="the spec profile every case is judged under: vllm-0.33 (default) or vllm-seed "
        "(spec/SPEC.md, Profiles) [env SHARDSPEC_PROFILE]",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        default=None,
        help="tp 2,4 and 10 generated cases per size [env SHARDSPEC_QUICK]",
    )
    parser.add_argument(
        "--max-examples", help="generated cases per group size (default 100) [env SHARDSPEC_MAX_EXAMPLES]"
    )
    parser.add_argument(
        "--mixed-max-examples",
        help="generated cases per group size of a mixed entry A/B (default 25, "
        "never more than --max-examples) [env SHARDSPEC_MIXED_MAX_EXAMPLES]",
    )
    parser.add_argument("--seed", help="seed of the generated cases (default 0) [env SHARDSPEC_SEED]")
    parser.add_argument("--fixtures-only", action="store_true", help="only the golden fixtures")
    parser.add_argument("--case", action="append", default=[], metavar="ID", help="run this fixture case only")
    parser.add_argument("--case-file", action="append", default=[], metavar="PATH", help="run this case file only")
    parser.add_argument("--json", metavar="PATH", help="write the JSON report here")
    parser.add_argument(
        "--xfails-file",
        help="invariant IDs or case ids expected to fail (YAML list/mapping, or one per line) [env SHARDSPEC_XFAILS]",
    )
    parser.add_argument(
        "--timeout",
        help="seconds a case may take on a rank before it counts as hung (default 60) [env SHARDSPEC_TIMEOUT]",
    )
    parser.add_argument("--pg-timeout", help="process-group timeout in seconds (default: --timeout)")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="all ranks as threads of this process, taking turns (see --in-process-group); the "
        "checks then run in the implementation's process",
    )
    parser.add_argument(
        "--in-process-group",
        choices=list(THREAD_GROUPS),
        default=None,
        help="implies --in-process. lockstep (default): shardspec's own group, for implementations "
        "that use only the comm they are given; torch-threads: a torch.distributed group of "
        "torch's threaded backend, also for implementations that call torch.distributed",
    )
    parser.add_argument(
        "--in-process-device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="where in-process runs (and shrinking) put the ranks: cuda (one GPU, ranks take "
        "turns, compiled kernels), cpu, or auto: cuda where there is a GPU (default)",
    )
    parser.add_argument(
        "--launcher",
        choices=["auto", "torchrun", "fork", "external"],
        default="auto",
        help="how rank processes start: torchrun, fork of one preloaded process (CPU only), "
        "auto: fork on the CPU, torchrun on GPUs (default), or external: your own launcher "
        "(torchrun across nodes, srun) starts them with the printed command; needs one --tp "
        "and a --run-dir every node can read and write",
    )
    parser.add_argument("--run-dir", type=pathlib.Path, help="keep the run's files in this new (or empty) folder")
    parser.add_argument("--no-shrink", action="store_true", help="do not shrink failing generated cases")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    return parser


def config_from_args(args: argparse.Namespace, environ: dict | None = None):
    """The run's configuration; raises UsageError (naming the option, variable or case file) on a bad value."""
    from shardspec.conformance.runner import RunConfig

    environ = os.environ if environ is None else environ
    values = resolve(args, environ)
    try:
        impls = implementation_names(values["impl"], values["impl_odd"])
    except ImplementationError as exc:
        raise UsageError(str(exc)) from None
    config = RunConfig(
        impls=impls,
        tp_sizes=values["tp"],
        seed=values["seed"],
        max_examples=values["max_examples"],
        mixed_max_examples=values["mixed_max_examples"],
        fixtures_only=args.fixtures_only,
        case_ids=args.case,
        case_files=args.case_file,
        case_timeout_s=values["timeout"],
        pg_timeout_s=values["pg_timeout"],
        in_process=args.in_process or args.in_process_group is not None,
        in_process_group=args.in_process_group or "lockstep",
        launcher=args.launcher,
        run_dir=args.run_dir,
        shrink=not args.no_shrink,
        verbose=args.verbose,
        in_process_device=args.in_process_device,
        xfails_file=values["xfails_file"],
        json_path=values["json"],
        profile=values["profile"],
    )
    if config.selected:  # named cases are loaded and bounded now, before anything is launched
        from shardspec.conformance.runner import collect_cases

        collect_cases(config)
    return config


def pytest_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The plugin's options (``--shardspec-NAME``) for every option given on this command line."""
    out = []
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if not action.option_strings or action.dest == "help" or value in (None, False, [], action.default):
            continue
        name = "--shardspec-" + action.option_strings[-1].lstrip("-")
        if isinstance(action, argparse._StoreTrueAction):
            out.append(name)
        elif isinstance(action, argparse._AppendAction):
            out += [part for item in value for part in (name, str(item))]
        else:
            out += [name, str(value)]
    return out


# pytest options the suite cannot honour: its ranks run in processes of its own, and pytest-xdist is
# not loaded (no third-party plugin is).
_NOT_SUPPORTED = ("-n", "--numprocesses", "--dist", "--maxprocesses")


def _check_pytest_arguments(extra: list[str]) -> None:
    for argument in extra:
        name = argument.split("=", 1)[0]
        if name in _NOT_SUPPORTED or (name.startswith("-n") and name[2:].isdigit()):
            raise UsageError(
                f"-- {argument}: pytest-xdist is not used; the suite runs each group's ranks in processes of "
                "its own and group sizes one after another"
            )


def pytest_command(options: list[str], extra: list[str]) -> list[str]:
    """pytest's arguments for a run of the suite's own test module with the plugin's ``options``.

    The run does not depend on the folder it starts in: no configuration file is read (``-c``), no
    folder is put on ``sys.path`` (``--import-mode=importlib``), and no plugin is loaded but the
    suite's (third-party ones stay off; see :func:`main`). The terminal reporter is off: the suite
    prints its own log and table. ``extra``: arguments after ``--``, given to pytest as they are.
    """
    return [
        "--pyargs",
        "shardspec.conformance",
        "-c",
        os.devnull,
        "--rootdir",
        os.getcwd(),
        "--import-mode=importlib",
        "--assert=plain",
        "-p",
        "shardspec.conformance.plugin",
        "-p",
        "no:terminal",
        "-s",
        *options,
        *extra,
    ]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # every value checked before anything is launched
        _check_pytest_arguments(extra)
        config = config_from_args(args)
        if config.in_process_device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise UsageError("--in-process-device cuda: no CUDA device is available")
    except UsageError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    import pytest

    previous = os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the suite's plugin alone, whatever else is installed
    try:
        code = int(pytest.main(pytest_command(pytest_arguments(parser, args), extra)))
    finally:
        if previous is None:
            os.environ.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
        else:
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = previous
    return 2 if code == int(pytest.ExitCode.USAGE_ERROR) else code


if __name__ == "__main__":
    sys.exit(main())
