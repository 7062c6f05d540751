"""The pytest plugin: one test per implementation, tp size and invariant; bad options end the session in one line."""

import subprocess
import sys


def _pytest(tmp_path, *args):
    command = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "shardspec.conformance",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
        *args,
    ]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_a_bad_option_is_a_usage_error_without_traceback(tmp_path):
    proc = _pytest(tmp_path, "--shardspec-tp", ",")
    assert proc.returncode == 4, proc.stdout[-2000:]
    assert "shardspec: --tp: ',' is not a list of group sizes" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_items_are_invariants_and_k_selects_one(tmp_path):
    proc = _pytest(
        tmp_path,
        "--shardspec-tp",
        "2",
        "--shardspec-fixtures-only",
        "--shardspec-in-process",
        "-k",
        "INV-OWNER",
        "-v",
        "--junitxml",
        "j.xml",
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "test_invariant[reference-tp2-INV-OWNER] PASSED" in proc.stdout
    assert "1 passed" in proc.stdout and "deselected" in proc.stdout
    assert 'name="test_invariant[reference-tp2-INV-OWNER]"' in (tmp_path / "j.xml").read_text()
