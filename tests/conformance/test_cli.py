"""The command line end to end in the in-process mode: exit codes, xfails, JSON report."""

import json

from harness_cases import small_cases, write_cases

from shardspec.conformance.cli import main
from shardspec.spec.profiles import DEFAULT_PROFILE


def _run(tmp_path, *extra):
    files = write_cases(small_cases(2), tmp_path)
    report = tmp_path / "report.json"
    args = ["--in-process", "--json", str(report), "--run-dir", str(tmp_path / "run")]
    args += [arg for path in files for arg in ("--case-file", path)]
    return main(args + list(extra)), json.loads(report.read_text())


def test_conforming_run_exits_0_with_metadata(tmp_path, throwaway_checkers):
    code, report = _run(tmp_path)
    assert code == 0 and report["exit_code"] == 0
    meta = report["metadata"]
    assert meta["implementations"] == ["reference"] and meta["tp_sizes"] == [2]
    assert meta["profile"] == DEFAULT_PROFILE  # the report names the profile its cases were judged under
    for key in ("spec_version", "torch", "triton", "numpy", "python", "backend", "device", "seed", "wall_s"):
        assert key in meta
    table = {row["invariant"]: row["results"]["2"] for row in report["sections"][0]["table"]}
    assert table["INV-TEST-COUNTS"] == "pass" and table["INV-TEST-WIRE"] == "pass"


def test_must_failure_exits_1_and_lists_a_reproduce_command(tmp_path, plugins_on_path, throwaway_checkers, capsys):
    code, report = _run(tmp_path, "--impl", "faulty_sharders:WrongCountsSharder")
    assert code == 1
    table = {row["invariant"]: row["results"]["2"] for row in report["sections"][0]["table"]}
    assert table["INV-TEST-COUNTS"] == "FAIL"
    failing = [c for c in report["sections"][0]["cases"] if c["status"] == "fail"]
    assert [c["case_id"] for c in failing] == ["small-tp2-3", "small-tp2-4"]
    out = capsys.readouterr().out
    assert "FAIL [INV-TEST-COUNTS] case small-tp2-3 (tp 2): ranks 0, 1, field num_rejected" in out
    assert (
        "reproduce: python -m shardspec.conformance --impl faulty_sharders:WrongCountsSharder "
        f"--profile {DEFAULT_PROFILE} --in-process-group lockstep --case-file"
    ) in out  # the same kind of group as this run


def test_xfails_turn_failures_into_xfail_and_warn_about_stale_entries(
    tmp_path, plugins_on_path, throwaway_checkers, capsys
):
    xfails = tmp_path / "xfails.txt"
    xfails.write_text("INV-TEST-COUNTS  # known\nINV-NO-SUCH-THING\nINV-TEST-WIRE\n")
    code, report = _run(tmp_path, "--impl", "faulty_sharders:WrongCountsSharder", "--xfails-file", str(xfails))
    assert code == 0
    table = {row["invariant"]: row["results"]["2"] for row in report["sections"][0]["table"]}
    assert table["INV-TEST-COUNTS"] == "xfail"
    warnings = "\n".join(report["warnings"])
    assert "'INV-NO-SUCH-THING' matches no invariant" in warnings
    assert "'INV-TEST-WIRE' did not fail" in warnings


def test_should_failure_is_a_warning(tmp_path, monkeypatch, throwaway_checkers):
    from shardspec.conformance.judge.checks import base

    def always(record):
        yield base.Violation("INV-LOCAL-ALIGNMENT", "not aligned", rank=record.rank)

    monkeypatch.setitem(base.RANK_CHECKERS, "INV-LOCAL-ALIGNMENT", always)
    code, report = _run(tmp_path)
    table = {row["invariant"]: row["results"]["2"] for row in report["sections"][0]["table"]}
    assert (code, table["INV-LOCAL-ALIGNMENT"]) == (0, "warn")


def test_errors_fail_the_run(tmp_path, plugins_on_path, throwaway_checkers):
    code, report = _run(tmp_path, "--impl", "faulty_sharders:RaisingSharder")
    assert code == 1
    table = {row["invariant"]: row["results"]["2"] for row in report["sections"][0]["table"]}
    assert table["(run errors)"] == "FAIL 1"


def test_missing_implementation_is_not_run(tmp_path, throwaway_checkers, capsys):
    code, report = _run(tmp_path, "--impl", "no_such_pkg_xyz:make")
    assert code == 1
    assert {c["status"] for c in report["sections"][0]["cases"]} == {"not-run"}
    assert "cannot import 'no_such_pkg_xyz'" in capsys.readouterr().out


def test_torch_threads_group_runs_from_the_command_line(tmp_path, plugins_on_path, throwaway_checkers, capsys):
    """--in-process-group implies --in-process; the report names the group; failures are reported alike."""
    code, report = _run(tmp_path, "--in-process-group", "torch-threads", "--impl", "faulty_sharders:WrongCountsSharder")
    assert code == 1 and report["metadata"]["backend"] == "torch-threads group (ranks as threads)"
    assert report["metadata"]["mode"] == "in-process (torch-threads)"
    out = capsys.readouterr().out
    assert "in-process (torch-threads group, ranks as threads on cpu)" in out
    commands = [line for line in out.splitlines() if "reproduce:" in line]
    assert any(
        "--impl faulty_sharders:WrongCountsSharder --profile " in line
        and "--in-process-group torch-threads --case-file" in line
        for line in commands
    ), commands


def test_a_run_with_warnings_keeps_the_files_its_reproduce_commands_name(tmp_path, monkeypatch):
    """Exit 0 with a SHOULD violation: the temporary run folder stays, so the printed command works."""
    import os
    import re

    from shardspec.conformance.judge.checks import base

    def always(record):
        yield base.Violation("INV-LOCAL-ALIGNMENT", "not aligned", rank=record.rank)

    monkeypatch.setitem(base.RANK_CHECKERS, "INV-LOCAL-ALIGNMENT", always)
    report = tmp_path / "r.json"
    assert main(["--in-process", "--tp", "2", "--max-examples", "1", "--json", str(report)]) == 0
    commands = [
        c["reproduce"]
        for c in json.loads(report.read_text())["sections"][0]["cases"]
        if c["case_id"].startswith("gen-")
    ]
    files = [m.group(1) for c in commands if (m := re.search(r"--case-file (\S+)", c))]
    assert files and all(os.path.exists(f) for f in files)


def test_pytest_xdist_options_are_refused_in_one_line(capsys):
    for extra in (["-n", "2"], ["-n4"], ["--numprocesses=2"], ["--dist", "load"]):
        assert main(["--", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "pytest-xdist is not used" in err and len(err.splitlines()) == 1, err


def test_last_failed_reruns_the_failing_invariants(tmp_path):
    """--lf, as the guide says: the second run selects only the tests that failed in the first, and says
    that its table still covers the whole run."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "shardspec.conformance", "--in-process", "--tp", "2", "--fixtures-only"]
    command += ["--impl", "shardspec.conformance.broken.gather:CountsSwapped"]
    first = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert first.returncode == 1 and (tmp_path / ".pytest_cache").is_dir(), first.stdout[-2000:] + first.stderr
    again = subprocess.run([*command, "--", "--lf"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 1, again.stdout[-2000:] + again.stderr
    assert "the exit status is that of the selected tests (1)" in again.stdout, again.stdout[-2000:]


def test_the_reports_name_the_profile(tmp_path, capsys):
    """Terminal, JSON and JUnit (a test-suite property) name the profile of the run."""
    import subprocess
    import sys

    junit, report = tmp_path / "junit.xml", tmp_path / "r.json"
    command = [sys.executable, "-m", "pytest", "--pyargs", "shardspec.conformance", "-p", "no:xdist", "-q", "-s"]
    command += ["--shardspec-in-process", "--shardspec-tp", "1", "--shardspec-case", "tp1-decode"]
    command += ["--shardspec-profile", "vllm-seed", "--shardspec-json", str(report), f"--junitxml={junit}"]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "profile vllm-seed" in proc.stdout
    assert json.loads(report.read_text())["metadata"]["profile"] == "vllm-seed"
    assert 'name="shardspec_profile" value="vllm-seed"' in junit.read_text()


def test_pytest_options_that_would_change_the_verdict_are_refused_from_the_environment(
    tmp_path, monkeypatch, plugins_on_path, capsys
):
    """PYTEST_ADDOPTS=--collect-only made a failing implementation exit 0 with no report, and "-W error"
    exited 2 and printed nothing: the command line owns the run, so both are refused in one line."""
    failing = ["--impl", "faulty_sharders:WrongCountsSharder", "--json", str(tmp_path / "r.json")]
    for value, named in (("--collect-only", "--collect-only"), ("-W error", "-W"), ("-q -Werror", "-Werror")):
        monkeypatch.setenv("PYTEST_ADDOPTS", value)
        assert _run_code(tmp_path, *failing) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"$PYTEST_ADDOPTS: {named}: not taken" in err, err
        assert not (tmp_path / "r.json").exists()
    monkeypatch.setenv("PYTEST_ADDOPTS", "")
    monkeypatch.setenv("PYTEST_PLUGINS", "faulty_sharders")
    assert main(["--in-process", "--case", "tp2-decode"]) == 2
    assert "$PYTEST_PLUGINS=faulty_sharders: the suite loads no plugin but its own" in capsys.readouterr().err


def test_pytest_options_after_the_separator_that_would_change_the_verdict_are_refused(capsys):
    for extra in (["--co"], ["-p", "no:shardspec.conformance.plugin"], ["-vWerror"], ["--pyargs", "os"], ["-h"]):
        assert main(["--in-process", "--case", "tp2-decode", "--", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"-- {extra[0]}: not taken" in err, err


def test_a_run_that_judged_nothing_never_exits_0(tmp_path, plugins_on_path, capsys):
    """Nothing selected (-k that matches no test): before, pytest's 5; never 0, and the run says why."""
    code = _run_code(tmp_path, "--impl", "faulty_sharders:WrongCountsSharder", "--", "-x", "-k", "no-such")
    assert code == 1
    assert "error: no case was judged: the run proves nothing" in capsys.readouterr().out


def _run_code(tmp_path, *extra) -> int:
    files = write_cases(small_cases(2), tmp_path)
    args = ["--in-process", *(arg for path in files for arg in ("--case-file", path))]
    return main(args + list(extra))


def test_help_names_the_other_commands_in_plain_text(capsys):
    import pytest

    with pytest.raises(SystemExit) as ended:
        main(["--help"])
    out = capsys.readouterr().out
    assert ended.value.code == 0
    assert "python -m shardspec.conformance upstream PATH" in out and "python -m shardspec.conformance report" in out
    assert "``" not in out and ":mod:" not in out and ":class:" not in out


def test_an_unprintable_or_huge_exception_is_the_implementations_error_cut_short(tmp_path, plugins_on_path, capsys):
    """Before, an exception whose __str__ raises was "the conformance suite failed", and a 20 MB message was
    printed whole (84 MB)."""
    entries = ["faulty_sharders:RaisesUnprintableInGather", "faulty_sharders:RaisesHugeMessageInGather"]
    code = _run_code(tmp_path, "--impl", ",".join(entries), "--json", str(tmp_path / "r.json"))
    out = capsys.readouterr().out
    assert code == 1 and len(out) < 1 << 20 and (tmp_path / "r.json").stat().st_size < 1 << 20
    data = json.loads((tmp_path / "r.json").read_text())
    sections = {s["implementation"]: {c["case_id"]: c for c in s["cases"]} for s in data["sections"]}
    unprintable, huge = (sections[entry]["small-tp2-3"]["errors"][0] for entry in entries)
    assert (unprintable["kind"], unprintable["rank"]) == ("raised", 1), unprintable
    assert "<its str() raised ValueError>" in unprintable["message"] and "suite failed" not in out
    assert (huge["kind"], huge["rank"]) == ("raised", 1) and "more characters cut" in huge["message"], huge["rank"]


def test_a_meta_or_sparse_tensor_returned_is_the_implementations_error(tmp_path, plugins_on_path, capsys):
    """Before, either was reported as "the conformance suite failed"."""
    entries = ["faulty_sharders:MetaTensorInResult", "faulty_sharders:SparseTensorInResult"]
    assert _run_code(tmp_path, "--impl", ",".join(entries), "--json", str(tmp_path / "r.json")) == 1
    assert "the conformance suite failed" not in capsys.readouterr().out
    data = json.loads((tmp_path / "r.json").read_text())
    sections = {s["implementation"]: {c["case_id"]: c for c in s["cases"]} for s in data["sections"]}
    for entry in entries:
        case = sections[entry]["small-tp2-3"]
        assert case["status"] in ("fail", "error") and all(e["kind"] != "harness" for e in case["errors"]), case
        assert {v["rank"] for v in case["violations"]} | {e["rank"] for e in case["errors"]} == {1}, case
        assert sections[entry]["small-tp2-2"]["status"] == "pass"
