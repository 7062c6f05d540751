"""Timeouts are bounded, with the bound in the message, and every usage error prints its line, whatever
pytest's terminal reporter does.

Before, ``--timeout``/``--pg-timeout`` of 1e10 or 0.001 ran nothing ("no case was judged", no reason), 1e-300
ended in a pytest INTERNALERROR (exit 3); and under pytest a bad ``SHARDSPEC_*`` variable printed nothing
with ``-p no:terminal`` (exit 2) and a traceback of the plugin with ``-q -q``.
"""

import os
import subprocess
import sys

import pytest

from shardspec.conformance.cli import main
from shardspec.conformance.usage import MAX_TIMEOUT_S, MIN_TIMEOUT_S


@pytest.mark.parametrize("flag", ["--timeout", "--pg-timeout"])
@pytest.mark.parametrize(
    "value, bound",
    [
        ("1e10", f"above {MAX_TIMEOUT_S:g} seconds"),
        ("86401", f"above {MAX_TIMEOUT_S:g} seconds"),
        ("0.001", f"below {MIN_TIMEOUT_S:g} second"),
        ("1e-300", f"below {MIN_TIMEOUT_S:g} second"),
        ("0.5", f"below {MIN_TIMEOUT_S:g} second"),
    ],
)
def test_a_timeout_out_of_range_is_refused_with_its_bound(flag, value, bound, capsys, monkeypatch):
    monkeypatch.delenv("SHARDSPEC_TIMEOUT", raising=False)
    assert main([flag, value, "--in-process", "--case", "tp2-decode"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{flag}: {value!r} is {bound}" in err, err


def test_the_variable_is_bounded_too(capsys, monkeypatch):
    monkeypatch.setenv("SHARDSPEC_TIMEOUT", "1e10")
    assert main(["--in-process", "--case", "tp2-decode"]) == 2
    assert f"$SHARDSPEC_TIMEOUT: '1e10' is above {MAX_TIMEOUT_S:g} seconds" in capsys.readouterr().err


def test_the_bounds_themselves_are_accepted(capsys, monkeypatch):
    monkeypatch.delenv("SHARDSPEC_TIMEOUT", raising=False)
    args = ["--in-process", "--case", "tp2-decode"]
    assert main(["--timeout", f"{MAX_TIMEOUT_S:g}", "--pg-timeout", f"{MIN_TIMEOUT_S:g}", *args]) == 0


def _pytest(tmp_path, *args, **env):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SHARDSPEC_")}
    environ.update(env, PYTEST_DISABLE_PLUGIN_AUTOLOAD="")
    command = [sys.executable, "-m", "pytest", "--pyargs", "shardspec.conformance", "-p", "no:cacheprovider", *args]
    return subprocess.run(command, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("quiet", [["-p", "no:terminal"], ["-q", "-q"], []], ids=["no-terminal", "q-q", "default"])
def test_a_bad_variable_under_pytest_prints_one_line_without_the_reporter(tmp_path, quiet):
    # Variables only: the run is resolved when the suite's tests are collected, where pytest reports an error
    # through its terminal reporter alone. (Small, should it run: tp 1, the fixtures.)
    proc = _pytest(tmp_path, *quiet, SHARDSPEC_TIMEOUT="0.001", SHARDSPEC_TP="1", SHARDSPEC_MAX_EXAMPLES="0")
    output = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, output[-3000:]
    assert f"shardspec: $SHARDSPEC_TIMEOUT: '0.001' is below {MIN_TIMEOUT_S:g} second" in output, output[-3000:]
    assert "Traceback" not in output and "raise pytest.UsageError" not in output, output[-3000:]


def test_a_bad_option_under_pytest_prints_its_line_without_the_reporter(tmp_path):
    small = ["--shardspec-case", "tp2-decode", "--shardspec-in-process"]
    proc = _pytest(tmp_path, "-p", "no:terminal", "--shardspec-timeout", "1e10", *small)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "shardspec: --timeout: '1e10' is above" in proc.stderr, proc.stderr
