"""The pytest plugin of the suite (entry point ``pytest11``): one test per implementation × tp × invariant.

    pytest --pyargs shardspec.conformance --shardspec-impl reference,production --shardspec-tp 2,4

Options are those of ``python -m shardspec.conformance`` with a ``--shardspec-``
prefix (both made from the table of :mod:`shardspec.conformance.run.options`); the
``SHARDSPEC_*`` variables are read where an option is not given.
Nothing happens unless the suite's test module is collected: the run is
created on first use and kept on the pytest config (no module state), and
the per-invariant table is printed at the end. ``-k INV-OWNER``, ``-x``,
``--lf`` and per-invariant JUnit rows work as for any test.
"""

from __future__ import annotations

import os
import pathlib
import signal
import threading
import warnings
from typing import TYPE_CHECKING

import pytest

from shardspec.conformance.run.options import OPTIONS, add_plugin_options, given_any
from shardspec.conformance.usage import UsageError

if TYPE_CHECKING:
    from shardspec.conformance.run.resolve import Resolved

# pytest loads this plugin in every session of an environment where shardspec is installed: the run (torch,
# the harness) loads only when a run is asked for, in the few functions that import it.

_SUITE_MODULE = pathlib.Path(__file__).resolve().with_name("test_conformance.py")
_RESOLVED = pytest.StashKey()  # the run's options, checked, and its named cases, loaded: once per session
_RUN = pytest.StashKey()
_SIGNAL = pytest.StashKey()  # the signal that ended the run (None: none yet), and the handlers it replaced
_DESELECTED = pytest.StashKey()  # whether -k/-m left some of the suite's tests out


class Handover:
    """The run ``python -m shardspec.conformance`` resolved from its own options, handed to this plugin
    (``pytest.main(..., plugins=[Handover(resolved)])``) so that nothing is checked or loaded twice."""

    def __init__(self, resolved: Resolved):
        self.resolved = resolved

    def pytest_collectreport(self, report):
        """The terminal reporter is off: a collection error is said here, in one line, or nothing would be."""
        if report.failed:
            lines = [line.strip() for line in report.longreprtext.splitlines() if line.strip()]
            print(f"error: pytest could not collect the suite: {(lines or ['no reason given'])[-1][:500]}")


def run_handed_over(resolved: Resolved, arguments: list[str]) -> int:
    """pytest run with ``arguments`` and this plugin alone (whatever else is installed), handed ``resolved``:
    the command line's exit status (pytest's usage error is 2)."""
    previous = os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        code = int(pytest.main(arguments, plugins=[Handover(resolved)]))
    finally:
        if previous is None:
            os.environ.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
        else:
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = previous
    return 2 if code == int(pytest.ExitCode.USAGE_ERROR) else code


def pytest_addoption(parser):
    add_plugin_options(parser.getgroup("shardspec", "shardspec conformance suite"))


def pytest_configure(config):
    """Options given on the command line are checked before collection: a bad one is pytest's usage error
    (one line, exit 4). Nothing is read when no ``--shardspec-*`` option was given (the run is resolved
    when the suite's tests are collected), nor when the command line handed over its run."""
    # Its tests carry it; registered so that an unknown mark is never a warning made an error (-W error).
    config.addinivalue_line("markers", "xdist_group(name): the group size's tests, kept together")
    handed = _handed(config)
    if handed:
        config.stash[_RESOLVED] = handed[0].resolved
    elif given_any(_given(config)):
        _resolved(config)


def _handed(config) -> list[Handover]:
    return [plugin for plugin in config.pluginmanager.get_plugins() if isinstance(plugin, Handover)]


def _given(config) -> dict:
    return {o.name: config.getoption(o.plugin_dest) for o in OPTIONS}


def _resolved(config) -> Resolved:
    """The run's options and named cases, resolved on first use and kept on the config."""
    if _RESOLVED not in config.stash:
        from shardspec.conformance.run.resolve import resolve_run  # a run is asked for (see the imports)

        try:
            config.stash[_RESOLVED] = resolve_run(_given(config))
        except UsageError as exc:
            raise pytest.UsageError(f"shardspec: {exc}") from None
    return config.stash[_RESOLVED]


def pytest_collectstart(collector):
    """The run is resolved (from the variables, where no option was given) before the suite's test module
    is collected: a bad value is then pytest's usage error, printed in one line whatever reporter is on,
    not a collection error that only the terminal reporter shows, with this plugin's frames."""
    if isinstance(collector, pytest.Module) and collector.path.resolve() == _SUITE_MODULE:
        _resolved(collector.config)


def conformance_run(config):
    """The run of this pytest session, created on first use."""
    if _RUN not in config.stash:
        from shardspec.conformance.run import session  # a run is asked for (see the imports)

        resolved = _resolved(config)
        if config.getoption("verbose", 0) > 1:
            resolved = resolved.with_verbose()
        _end_on_signals(config)  # before the cases are made: a signal then still leaves a report
        run = session.ConformanceSession(resolved.config, log=print, case_set=resolved.cases)
        print(run.header())
        config.stash[_RUN] = run
    return config.stash[_RUN]


def _end_on_signals(config) -> None:
    """SIGINT and SIGTERM end the run alike: the first raises KeyboardInterrupt (the ranks are stopped and the
    cases judged so far reported); those that follow while the run ends are said, not raised, so that the
    report is written whatever is pressed meanwhile."""
    if threading.current_thread() is not threading.main_thread() or _SIGNAL in config.stash:
        return

    def interrupt(signum, frame):
        name = signal.Signals(signum).name
        if config.stash[_SIGNAL][0] is None:
            config.stash[_SIGNAL] = (signum, config.stash[_SIGNAL][1])
            raise KeyboardInterrupt(name)
        print(f"{name} again: the run is ending; its report of the cases judged so far is being written")

    replaced = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}
    config.stash[_SIGNAL] = (None, replaced)


def pytest_unconfigure(config):
    if _SIGNAL in config.stash:
        for signum, handler in config.stash[_SIGNAL][1].items():
            signal.signal(signum, handler)


def pytest_generate_tests(metafunc):
    if "shardspec_invariant" not in metafunc.fixturenames:
        return
    run = conformance_run(metafunc.config)
    params = [
        pytest.param(
            impl, tp, invariant, id=f"{run.label(impl)}-tp{tp}-{invariant}", marks=pytest.mark.xdist_group(f"tp{tp}")
        )
        for tp in run.tp_sizes
        for impl in run.config.impls
        for invariant in run.judged_rows()
    ]
    metafunc.parametrize("shardspec_entry, shardspec_tp, shardspec_invariant", params)


@pytest.fixture
def shardspec_run(request):
    return conformance_run(request.config)


def verdict_of(run, entry: str, tp: int, invariant: str) -> None:
    """Skip, xfail, warn or fail one test the way the report judges its cell."""
    cell, details = run.verdict(entry, tp, invariant)
    if cell.startswith("n/a") or cell == "not-run":
        pytest.skip(f"{invariant} at tp {tp}: {details or 'no case judged it'}")
    if cell.startswith("xfail"):
        pytest.xfail(details or f"{invariant} listed in the xfails file")
    if cell == "warn":
        warnings.warn(f"{invariant} (SHOULD) violated at tp {tp}: {details}", stacklevel=2)
    assert not cell.startswith("FAIL"), details


def pytest_deselected(items):
    if items:
        items[0].config.stash[_DESELECTED] = True


def pytest_sessionfinish(session, exitstatus):
    """The run's report and JSON; the exit status is the run's when every test of the suite was selected
    (a run that judged no case is an error, never a pass), 128 + the signal after SIGINT/SIGTERM."""
    config = session.config
    run = config.stash.get(_RUN, None)
    if run is None or not run.sizes_run:
        if _handed(config) and exitstatus == pytest.ExitCode.INTERRUPTED and run is None:
            _interrupted_before_any_case(session)
        elif _handed(config):
            _judged_nothing(session, exitstatus)
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    log = reporter.write_line if reporter is not None else print
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    signum = _signal_of(config)
    if interrupted:
        log(f"interrupted by {signal.Signals(signum).name}: the report below covers the cases judged so far")
    suite_errors = 0 if interrupted else session.testsfailed  # beside a FAIL cell's failure the run fails anyway
    code = run.finish(
        log=log, interrupted=signal.Signals(signum).name if interrupted else None, suite_errors=suite_errors
    )
    if interrupted:
        session.exitstatus = 128 + signum
    elif code and session.exitstatus == pytest.ExitCode.OK and not config.stash.get(_DESELECTED, False):
        session.exitstatus = code
    if code and config.stash.get(_DESELECTED, False) and not interrupted:
        log(
            "note: the table covers the whole run, which FAILED; the exit status is that of the selected "
            f"tests ({session.exitstatus})"
        )
    if reporter is not None:  # pytest's own summary follows; python -m shardspec.conformance prints none
        log(f"conformance exit status: {code}")


def _signal_of(config) -> int:
    """The signal that ended the run; SIGINT where a KeyboardInterrupt came another way."""
    signum = config.stash.get(_SIGNAL, (None, None))[0]
    return signal.SIGINT if signum is None else signum


def _interrupted_before_any_case(session) -> None:
    """A signal while the run was being made (its cases drawn): nothing was judged, and the report says so."""
    from shardspec.conformance.run.session import report_unstarted  # a run was asked for (see the imports)

    signum = _signal_of(session.config)
    report_unstarted(session.config.stash[_RESOLVED].config, signal.Signals(signum).name, log=print)
    session.exitstatus = 128 + signum


def _judged_nothing(session, exitstatus) -> None:
    """The command line's run ended before any group size ran (nothing selected, a collection error): it
    proves nothing, and says so; its exit status is never 0."""
    print(f"error: no case was judged: the run proves nothing (pytest's exit status {int(exitstatus)})")
    if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED, pytest.ExitCode.INTERRUPTED):
        session.exitstatus = 1
