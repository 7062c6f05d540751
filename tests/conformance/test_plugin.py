"""The pytest plugin: one test per implementation, tp size and invariant; bad options end the session in one line."""

import re
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


def test_a_bad_variable_is_named_once_an_option_is_given(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDSPEC_LAUNCHER", "slurm")
    proc = _pytest(tmp_path, "--shardspec-tp", "2", "--shardspec-in-process-device", "cpu")
    assert proc.returncode == 4, proc.stdout[-2000:]
    assert "shardspec: $SHARDSPEC_LAUNCHER: 'slurm' is not one of auto" in proc.stdout + proc.stderr
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


def test_the_command_line_is_pytest_with_the_plugin(tmp_path):
    """`python -m shardspec.conformance` runs pytest: its options are the plugin's, arguments after -- are
    pytest's (here -k and --junitxml), and a deselected invariant does not decide the exit status."""
    junit = tmp_path / "j.xml"
    command = [sys.executable, "-m", "shardspec.conformance", "--tp", "2", "--fixtures-only", "--in-process"]
    command += ["--impl", "shardspec.conformance.broken.shard:OwnerBySlotDivision"]
    owner = subprocess.run(
        [*command, "--", "-k", "INV-OWNER", f"--junitxml={junit}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert owner.returncode == 1, owner.stdout[-3000:] + owner.stderr[-3000:]
    assert 'OwnerBySlotDivision-tp2-INV-OWNER]"' in junit.read_text()
    assert junit.read_text().count("<testcase ") == 1
    other = subprocess.run(
        [*command, "--", "-k", "INV-LOGPROBS-SHAPES"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert re.search(r"^INV-OWNER +MUST +FAIL", other.stdout, re.M)  # the table still shows the whole run
    assert other.returncode == 0, other.stdout[-3000:]


def test_the_plugin_costs_other_pytest_sessions_no_torch_import():
    """Installed, the plugin loads in every pytest session of the environment: it must stay light."""
    code = "import sys, shardspec.conformance.plugin; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_an_error_of_the_suite_itself_is_never_a_pass(tmp_path, plugins_on_path):
    """Tests that fail outside the table (the suite's own run raised) make the run fail, in its last line and
    its JSON, not only in pytest's exit status: before, it printed PASSED and wrote exit_code 0."""
    import json
    import subprocess
    import sys

    report = tmp_path / "r.json"
    command = [sys.executable, "-m", "pytest", "--pyargs", "shardspec.conformance", "-p", "breaks_the_suite"]
    command += ["-p", "no:cacheprovider", "-p", "no:xdist", "--shardspec-impl", "reference"]
    command += ["--shardspec-tp", "1,2", "--shardspec-max-examples", "1", "--shardspec-json", str(report)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode != 0, out.stdout[-3000:]
    assert "PASSED in" not in out.stdout and "the run proves nothing" in out.stdout, out.stdout[-3000:]
    assert json.loads(report.read_text())["exit_code"] == 1
