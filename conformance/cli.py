"""``python -m shardspec.conformance``: check implementations against the spec.

A thin wrapper over pytest with the suite's plugin (:mod:`shardspec.conformance.plugin`): the
options (those of the plugin without its ``--shardspec-`` prefix, both made from the table of
:mod:`shardspec.conformance.run.options`) are checked here, once, and the run they describe is handed to
the plugin; arguments after ``--`` go to pytest (e.g. ``-- -k INV-OWNER --junitxml=j.xml``), but those
that change what pytest collects, loads or does with a warning, refused there and in $PYTEST_ADDOPTS.
Exit code 0 when every MUST invariant holds, every case ran and no rank
failed; 1 otherwise (a run that judged no case included); 2 for a usage
error, reported in one line before anything is launched; 130/143 after
SIGINT/SIGTERM, with a partial report. SHOULD violations are warnings.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import textwrap
from collections.abc import Mapping
from typing import TYPE_CHECKING

from shardspec.conformance.output_paths import ReportPathError, check_report_path, is_junit_report
from shardspec.conformance.run.options import OPTIONS, add_arguments
from shardspec.conformance.usage import UsageError

if TYPE_CHECKING:
    from shardspec.conformance.run.resolve import Resolved

# What --help says, in plain text (the module's docstring is reStructuredText).
_DESCRIPTION = """Check implementations against the spec, in real multi-rank runs, through pytest.

Arguments after -- go to pytest (e.g. -- -k INV-OWNER --junitxml=j.xml), but not those that change what
pytest collects, loads or does with a warning. Exit status 0 when every MUST invariant holds, every case
ran and no rank failed; 1 otherwise (a run that judged no case included); 2 for a usage error, said in one
line before anything is launched; 128 + the signal after SIGINT or SIGTERM, with a partial report. SHOULD
violations are warnings.

Other commands:
  python -m shardspec.conformance upstream PATH [--behaviour]
      which fields a vLLM tree, wheel or batch_shard.py touches that no profile covers; with
      --behaviour, run it and say which profile's rules it follows
  python -m shardspec.conformance report R1.json [R2.json ...] -o DIR
      the HTML compliance matrix of JSON reports (and report releases ... for a page of releases)
"""


def build_parser() -> argparse.ArgumentParser:
    variables = ", ".join(f"{o.env} ({o.flag})" for o in OPTIONS if o.env)
    epilog = (
        f"Options may also come from the environment: {variables}; a command-line option wins, and a "
        "variable that an option overrides is not read."
    )
    parser = argparse.ArgumentParser(
        prog="python -m shardspec.conformance",
        description=_DESCRIPTION,
        epilog=textwrap.fill(epilog, width=100, break_on_hyphens=False),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return parser


def resolved_run(args: argparse.Namespace, environ: dict | None = None) -> Resolved:
    """The run's configuration and named cases; raises UsageError (naming the option, variable or case file)."""
    from shardspec.conformance.run.resolve import resolve_run  # torch and the run's modules: --help needs none

    return resolve_run(vars(args), os.environ if environ is None else environ)


# pytest options the suite cannot honour: its ranks run in processes of its own, and pytest-xdist is
# not loaded (no third-party plugin is).
_NOT_SUPPORTED = ("-n", "--numprocesses", "--dist", "--maxprocesses")
# pytest options that change what pytest collects, which plugins judge the run, or what a warning does: the
# command line owns the run, so they are refused, after -- and in $PYTEST_ADDOPTS alike (a failing
# implementation exited 0 under PYTEST_ADDOPTS=--collect-only). Single-letter ones also fused (-Werror).
_OWNED = {
    "-p": "it loads or blocks a plugin",
    "-W": "it turns warnings into errors or hides them",
    "--pythonwarnings": "it turns warnings into errors or hides them",
    "-c": "the suite reads no configuration file",
    "--config-file": "the suite reads no configuration file",
    "-o": "the suite reads no configuration",
    "--override-ini": "the suite reads no configuration",
    "--rootdir": "the suite sets it",
    "--confcutdir": "the suite reads no conftest.py",
    "--import-mode": "the suite sets it",
    "--pyargs": "the suite collects only its own tests",
    "--ignore": "the suite collects only its own tests",
    "--ignore-glob": "the suite collects only its own tests",
    "--continue-on-collection-errors": "a collection error ends the run",
    **dict.fromkeys(
        ("--collect-only", "--co", "--setup-only", "--setup-plan", "--fixtures", "--funcargs", "--fixtures-per-test"),
        "it runs no case, and a run that judged nothing cannot pass",
    ),
    **dict.fromkeys(("-h", "--help", "-V", "--version", "--markers"), "it runs no case (see --help before --)"),
}
# pytest's single-letter options that take a value: what follows them in one argument is the value.
_TAKES_VALUE = set("kmprWcon")


def _refusal(argument: str) -> str | None:
    """Why ``argument`` (one of pytest's) is not taken, or None."""
    name = argument.split("=", 1)[0]
    if name.startswith("--"):
        return _OWNED.get(name)
    for letter in name[1:] if name.startswith("-") else "":
        if f"-{letter}" in _OWNED:
            return _OWNED[f"-{letter}"]
        if letter in _TAKES_VALUE:
            break
    return None


# pytest's reports written to a path: checked as --json is (output_paths.py), never through a link or into
# a FIFO or device, never over a file that is not such a report.
_REPORT_PATHS = ("--junitxml", "--junit-xml")


def _check_report_paths(extra: list[str], where: str) -> None:
    for index, argument in enumerate(extra):
        name, joined, value = argument.partition("=")
        if name not in _REPORT_PATHS:
            continue
        if not joined and index + 1 < len(extra):  # --junitxml PATH
            value = extra[index + 1]
        try:
            check_report_path(value, is_junit_report, "a JUnit XML report")
        except ReportPathError as exc:
            raise UsageError(f"{where} {name}: {exc}") from None


def _check_pytest_arguments(extra: list[str], where: str = "--") -> None:
    plugin_flags = {o.plugin_flag: o.flag for o in OPTIONS}
    _check_report_paths(extra, where)
    for argument in extra:
        name = argument.split("=", 1)[0]
        if name in plugin_flags:  # the run is resolved from this command's options alone
            raise UsageError(f"{where} {argument}: give it before -- as {plugin_flags[name]}")
        if name in _NOT_SUPPORTED or (name.startswith("-n") and name[2:].isdigit()):
            raise UsageError(
                f"{where} {argument}: pytest-xdist is not used; the suite runs each group's ranks in processes of "
                "its own and group sizes one after another"
            )
        why = _refusal(argument)
        if why:
            raise UsageError(f"{where} {argument}: not taken: {why}; the suite's own options set the run")


def _check_pytest_environment(environ: Mapping[str, str]) -> None:
    """pytest reads $PYTEST_ADDOPTS (options put before the command line's) and $PYTEST_PLUGINS (plugins it
    loads even with autoloading off): the first is checked as the options after -- are, the second refused."""
    if environ.get("PYTEST_PLUGINS"):
        plugins = environ["PYTEST_PLUGINS"]
        raise UsageError(f"$PYTEST_PLUGINS={plugins}: the suite loads no plugin but its own; unset it")
    try:
        added = shlex.split(environ.get("PYTEST_ADDOPTS", ""))
    except ValueError as exc:
        raise UsageError(f"$PYTEST_ADDOPTS cannot be read: {exc}") from None
    _check_pytest_arguments(added, "$PYTEST_ADDOPTS:")


def pytest_command(extra: list[str]) -> list[str]:
    """pytest's arguments for a run of the suite's own test module with the plugin (the run itself is
    handed to the plugin, see :func:`shardspec.conformance.plugin.run_handed_over`).

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
        _check_pytest_environment(os.environ)
        resolved = resolved_run(args)
    except UsageError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # nothing was started: no report to write
        print(f"{parser.prog}: interrupted while the options were checked; nothing ran", file=sys.stderr)
        return 130
    # pytest (the test extra) runs the suite, with the plugin: --help and a usage error need neither
    from shardspec.conformance.plugin import run_handed_over

    return run_handed_over(resolved, pytest_command(extra))


if __name__ == "__main__":
    sys.exit(main())
