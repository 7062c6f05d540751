"""Prints the suite's per-invariant table after ``pytest --pyargs shardspec.conformance``."""

import os


def pytest_terminal_summary(terminalreporter):
    from shardspec.conformance import session as session_module

    session = session_module.SHARED
    if session is None:
        return
    exit_code = session.finish(json_path=os.environ.get("SHARDSPEC_JSON"),
                               xfails_file=os.environ.get("SHARDSPEC_XFAILS"),
                               log=terminalreporter.write_line)
    terminalreporter.write_line(f"conformance exit status: {exit_code}")
