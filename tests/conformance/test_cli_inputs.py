"""Bad command-line values and environment variables: one line naming the problem, exit 2, nothing launched.

Each example is one a new or hostile user tried; before, several printed PASSED or a raw traceback.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from harness_cases import PLUGINS, small_cases, write_cases

from shardspec.conformance.cli import main
from shardspec.spec.profiles import PROFILES as BUNDLED

PROFILES = os.path.join(os.path.dirname(__file__), "data", "profiles")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tp", ","], "--tp: ',' is not a list of group sizes"),
        (["--tp", "2,,4"], "--tp: '2,,4' is not a list of group sizes"),
        (["--tp", "-1"], "--tp: -1 is below 1"),
        (["--tp", "0"], "--tp: 0 is below 1"),
        (["--tp", "two"], "--tp: 'two' is not an integer"),
        (["--tp", "1000"], "--tp: group size 1000 is above 64"),
        (["--impl", ""], "--impl: '' names no implementation"),
        (["--impl", " , "], "--impl: ' , ' names no implementation"),
        (["--impl", "a/b/c"], "malformed implementation entry 'a/b/c'"),
        (["--timeout", "0"], "--timeout: '0' must be a finite number of seconds above 0"),
        (["--timeout", "nan"], "--timeout: 'nan' must be a finite number of seconds above 0"),
        (["--timeout", "inf"], "--timeout: 'inf' must be a finite number of seconds above 0"),
        (["--pg-timeout", "-3"], "--pg-timeout: '-3' must be a finite number of seconds above 0"),
        (["--max-examples", "-1"], "--max-examples: -1 is below 0"),
        (["--max-examples", "99999999999999999999"], "--max-examples: 99999999999999999999 is above 10000"),
        (["--mixed-max-examples", "10001"], "--mixed-max-examples: 10001 is above 10000"),
        (
            ["--profile", "vllm-9"],
            f"--profile: unknown profile 'vllm-9'; this spec defines {', '.join(BUNDLED)}",
        ),
        (["--profile-file", f"{PROFILES}/bad-rule.yaml"], "bad-rule.yaml: unknown rule 'owners' (rules: owner,"),
        (["--profile-file", f"{PROFILES}/bad-value.yaml"], "bad-value.yaml: rule owner: unknown value 'slot_div_tp'"),
        (["--profile-file", f"{PROFILES}/bad-parent.yaml"], "bad-parent.yaml: extends unknown profile 'vllm-0.99'"),
        (["--profile-file", "/no/such/profile.yaml"], "--profile-file: /no/such/profile.yaml: cannot be read"),
        (["--seed", "x"], "--seed: 'x' is not an integer"),
        (["--json", "/no/such/folder/r.json"], "--json: the folder /no/such/folder does not exist"),
        (["--case", "../../etc/passwd"], "--case '../../etc/passwd': not a fixture id"),
        (["--case", "no-such-case"], "--case no-such-case: "),
        (["--case-file", "/no/such/case.yaml"], "--case-file /no/such/case.yaml: no such file"),
        (["--launcher", "slurm"], "--launcher: 'slurm' is not one of auto, torchrun, fork, external"),
        (["--in-process-group", "gloo"], "--in-process-group: 'gloo' is not one of lockstep, torch-threads"),
        (["--in-process-device", "tpu"], "--in-process-device: 'tpu' is not one of auto, cpu, cuda"),
        (["--impl-odd", "x"], "--impl-odd: unknown implementation 'x'"),
        (["--impl-odd", "reference/production"], "--impl-odd: 'reference/production' is not one implementation"),
    ],
)
def test_bad_option_is_one_line_and_exit_2(args, message, capsys, monkeypatch):
    monkeypatch.delenv("SHARDSPEC_TIMEOUT", raising=False)
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("SHARDSPEC_TIMEOUT", "abc", "$SHARDSPEC_TIMEOUT: 'abc' is not a number of seconds"),
        ("SHARDSPEC_TP", "1,,2", "$SHARDSPEC_TP: '1,,2' is not a list of group sizes"),
        ("SHARDSPEC_MAX_EXAMPLES", "many", "$SHARDSPEC_MAX_EXAMPLES: 'many' is not an integer"),
        ("SHARDSPEC_QUICK", "maybe", "$SHARDSPEC_QUICK: 'maybe' is not a boolean"),
        ("SHARDSPEC_IMPL", ",", "$SHARDSPEC_IMPL: ',' names no implementation"),
        ("SHARDSPEC_PROFILE", "seed", "$SHARDSPEC_PROFILE: unknown profile 'seed'"),
        ("SHARDSPEC_LAUNCHER", "slurm", "$SHARDSPEC_LAUNCHER: 'slurm' is not one of auto, torchrun, fork, external"),
        ("SHARDSPEC_IMPL_ODD", "x", "$SHARDSPEC_IMPL_ODD: unknown implementation 'x'"),
    ],
)
def test_bad_environment_variable_is_named(name, value, message, capsys, monkeypatch):
    monkeypatch.setenv(name, value)
    assert main(["--fixtures-only"]) == 2
    assert message in capsys.readouterr().err


def test_a_variable_overridden_by_its_option_is_not_read(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SHARDSPEC_TIMEOUT", "junk")
    files = write_cases(small_cases(2)[:1], tmp_path)
    assert main(["--timeout", "30", "--in-process", "--case-file", files[0]]) == 0


def test_bad_xfails_file_is_found_before_the_run(tmp_path, capsys):
    assert main(["--xfails-file", str(tmp_path / "missing.txt"), "--fixtures-only"]) == 2
    assert "--xfails-file: cannot read" in capsys.readouterr().err


def test_a_used_run_dir_is_refused(tmp_path, capsys):
    (tmp_path / "old-result.jsonl").write_text("{}")
    assert main(["--run-dir", str(tmp_path), "--fixtures-only"]) == 2
    assert "is not an empty folder" in capsys.readouterr().err


def test_case_file_of_absurd_size_is_refused_before_any_tensor(tmp_path, capsys):
    from dataclasses import replace

    from shardspec.fixtures import case_to_yaml

    case = replace(small_cases(2)[0], max_num_reqs=10**9, vocab_size=10**8)
    path = tmp_path / f"{case.case_id}.yaml"
    path.write_text(case_to_yaml(case))
    assert main(["--case-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert "max_num_reqs 1000000000 is not in 1..65536" in err and "vocab_size 100000000" in err


def test_unknown_expected_error_is_refused(tmp_path, capsys):
    from dataclasses import replace

    from shardspec.fixtures import case_to_yaml

    case = replace(small_cases(2)[0], expect_error="PRE-NO-SUCH-THING")
    path = tmp_path / f"{case.case_id}.yaml"
    path.write_text(case_to_yaml(case))
    assert main(["--case-file", str(path)]) == 2
    assert "expect_error 'PRE-NO-SUCH-THING' is not a precondition ID of the spec" in capsys.readouterr().err


def test_a_run_that_judged_no_case_fails(tmp_path, capsys):
    report = tmp_path / "r.json"
    assert (
        main(["--impl", "no_such_pkg_xyz:make", "--in-process", "--fixtures-only", "--tp", "2", "--json", str(report)])
        == 1
    )
    out = capsys.readouterr().out
    assert "no case was judged" in out and "PASSED" not in out
    assert json.loads(report.read_text())["exit_code"] == 1


def test_a_clone_named_shardspec_in_the_working_folder_is_named(tmp_path):
    """From a folder holding a clone called shardspec/, Python imports the clone's folder as a namespace
    package in place of the installed one: say so, instead of failing later without a report."""
    (tmp_path / "shardspec" / "spec").mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, "-m", "shardspec.conformance", "--json", "r.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"the folder {tmp_path / 'shardspec'} shadows the installed shardspec package" in proc.stderr


@pytest.mark.slow
def test_sigterm_ends_the_run_with_a_partial_report_and_no_rank_left(tmp_path):
    files = write_cases(small_cases(2), tmp_path)
    report = tmp_path / "r.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
    command = [
        sys.executable,
        "-m",
        "shardspec.conformance",
        "--impl",
        "faulty_sharders:HangingSharder",
        "--timeout",
        "120",
        "--json",
        str(report),
        "--run-dir",
        str(tmp_path / "run"),
    ]
    command += [arg for path in files for arg in ("--case-file", path)]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while not list((tmp_path / "run").rglob("*.frames")) and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(8)  # the hanging case is reached within seconds
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "interrupted by SIGTERM" in out
    data = json.loads(report.read_text())
    assert data["exit_code"] == 128 + signal.SIGTERM and any("partial report" in w for w in data["warnings"])
    status = {c["case_id"]: c for c in data["sections"][0]["cases"]}
    assert status["small-tp2-2"]["status"] == "pass"
    # The case the signal kept from running is reported as not run, and says why.
    assert status["small-tp2-4"]["status"] == "not-run" and "interrupted by SIGTERM" in status["small-tp2-4"]["reason"]
    table = {row["invariant"]: row["results"]["2"] for row in data["sections"][0]["table"]}
    assert table["(cases not run)"] not in ("0", 0), table["(cases not run)"]
    # Every case keeps its reproduce command, those judged before the signal and those it kept from running.
    for case_id, case in status.items():
        assert case["reproduce"].endswith(f"--case-file {tmp_path / case_id}.yaml"), case
    assert not any(line.strip() == "reproduce:" for line in out.splitlines()), out[-3000:]
    time.sleep(1)
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "run")], capture_output=True, text=True).stdout.split()
    assert not left, f"processes of the run still alive: {left}"
