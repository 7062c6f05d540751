"""``python -m shardspec.conformance``: check implementations against the spec.

A thin wrapper over pytest with the suite's plugin (:mod:`shardspec.conformance.plugin`): the
options (those of the plugin without its ``--shardspec-`` prefix, both made from the table of
:mod:`shardspec.conformance.options`) are checked here, once, and the run they describe is handed to
the plugin; arguments after ``--`` go to pytest (e.g. ``-- -k INV-OWNER --junitxml=j.xml``).
Exit code 0 when every MUST invariant holds, every case ran and no rank
failed; 1 otherwise (a run that judged no case included); 2 for a usage
error, reported in one line before anything is launched; 130/143 after
SIGINT/SIGTERM, with a partial report. SHOULD violations are warnings.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

from shardspec.conformance.options import OPTIONS, Resolved, resolve_run
from shardspec.conformance.usage import UsageError

# Light imports only: the pytest plugin imports this module in every pytest session of an environment
# where shardspec is installed; torch and the suite load when a run starts.


def build_parser() -> argparse.ArgumentParser:
    from shardspec.conformance.options import add_arguments

    variables = ", ".join(f"{o.env} ({o.flag})" for o in OPTIONS if o.env)
    epilog = (
        f"Options may also come from the environment: {variables}; a command-line option wins, and a "
        "variable that an option overrides is not read."
    )
    parser = argparse.ArgumentParser(
        prog="python -m shardspec.conformance",
        description=__doc__,
        epilog=textwrap.fill(epilog, width=100, break_on_hyphens=False),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return parser


def resolved_run(args: argparse.Namespace, environ: dict | None = None) -> Resolved:
    """The run's configuration and named cases; raises UsageError (naming the option, variable or case file)."""
    return resolve_run(vars(args), os.environ if environ is None else environ)


# pytest options the suite cannot honour: its ranks run in processes of its own, and pytest-xdist is
# not loaded (no third-party plugin is).
_NOT_SUPPORTED = ("-n", "--numprocesses", "--dist", "--maxprocesses")


def _check_pytest_arguments(extra: list[str]) -> None:
    plugin_flags = {o.plugin_flag: o.flag for o in OPTIONS}
    for argument in extra:
        name = argument.split("=", 1)[0]
        if name in plugin_flags:  # the run is resolved from this command's options alone
            raise UsageError(f"-- {argument}: give it before -- as {plugin_flags[name]}")
        if name in _NOT_SUPPORTED or (name.startswith("-n") and name[2:].isdigit()):
            raise UsageError(
                f"-- {argument}: pytest-xdist is not used; the suite runs each group's ranks in processes of "
                "its own and group sizes one after another"
            )


def pytest_command(extra: list[str]) -> list[str]:
    """pytest's arguments for a run of the suite's own test module with the plugin (the run itself is
    handed to the plugin, see :class:`shardspec.conformance.plugin.Handover`).

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
        *extra,
    ]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # every value checked, and every named case loaded, once, before anything is launched
        _check_pytest_arguments(extra)
        resolved = resolved_run(args)
    except UsageError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    import pytest

    from shardspec.conformance.plugin import Handover

    previous = os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the suite's plugin alone, whatever else is installed
    try:
        code = int(pytest.main(pytest_command(extra), plugins=[Handover(resolved)]))
    finally:
        if previous is None:
            os.environ.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
        else:
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = previous
    return 2 if code == int(pytest.ExitCode.USAGE_ERROR) else code


if __name__ == "__main__":
    sys.exit(main())
