"""Real multi-process launches: raising and hanging ranks, the example adapter, mixed groups.

Each test is one or two launches of a few seconds; marked slow.
"""

import json
import os
import subprocess
import sys

import pytest
from harness_cases import EXAMPLE, PLUGINS, small_cases, write_cases

pytestmark = pytest.mark.slow


def _suite(tmp_path, tp, *args, pythonpath=PLUGINS):
    files = write_cases(small_cases(tp), tmp_path)
    report = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(pythonpath), os.environ.get("PYTHONPATH")])))
    command = [
        sys.executable,
        "-m",
        "shardspec.conformance",
        "--json",
        str(report),
        "--run-dir",
        str(tmp_path / "run"),
        *args,
    ]
    command += [arg for path in files for arg in ("--case-file", path)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    return proc, json.loads(report.read_text())


def _cases(report):
    return {c["case_id"]: c for c in report["sections"][0]["cases"]}


def test_raising_rank_fails_only_its_case(tmp_path):
    proc, report = _suite(tmp_path, 2, "--impl", "faulty_sharders:RaisingSharder")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cases = _cases(report)
    assert cases["small-tp2-2"]["status"] == "pass" and cases["small-tp2-4"]["status"] == "pass"
    broken = cases["small-tp2-3"]
    assert broken["status"] == "error"
    first = broken["errors"][0]
    assert (first["rank"], first["kind"], first["step"]) == (1, "raised", "gather")
    assert "deliberate failure on rank 1" in first["traceback"]
    assert "rank 1 [raised]: RuntimeError in step gather" in proc.stdout


def test_hanging_rank_times_out_and_the_run_goes_on(tmp_path):
    proc, report = _suite(tmp_path, 2, "--impl", "faulty_sharders:HangingSharder", "--timeout", "6")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cases = _cases(report)
    assert cases["small-tp2-2"]["status"] == "pass" and cases["small-tp2-4"]["status"] == "pass"
    hung = cases["small-tp2-3"]
    assert hung["status"] == "error"
    own = [e for e in hung["errors"] if e["rank"] == 1]
    assert own and own[0]["kind"] == "timeout" and "in step gather" in own[0]["message"], hung["errors"]


def test_example_adapter_passes_alone_and_mixed_with_the_reference(tmp_path):
    adapter = "shardspec_adapter:make_sharder"
    proc, report = _suite(tmp_path, 3, "--impl", f"{adapter},{adapter}/reference", pythonpath=EXAMPLE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["metadata"]["implementations"] == [adapter, f"{adapter}/reference"]
    assert {c["status"] for c in report["sections"][1]["cases"]} == {"pass"}
    assert {c["status"] for c in report["sections"][0]["cases"]} == {"pass"}


def test_the_guides_example_adapter_passes_every_fixture(tmp_path):
    """The command docs/validate-your-implementation.md gives for examples/out_of_tree_adapter, at tp 2 over
    the fixtures (extension fields and vLLM 0.33's inputs included)."""
    proc = subprocess.run(
        [sys.executable, "-m", "shardspec.conformance", "--impl", "shardspec_adapter:make_sharder", "--tp", "2"]
        + ["--fixtures-only", "--json", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(EXAMPLE)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_torchrun_launcher_reports_a_raising_rank_and_goes_on(tmp_path):
    proc, report = _suite(tmp_path, 2, "--impl", "faulty_sharders:RaisingSharder", "--launcher", "torchrun")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cases = _cases(report)
    assert cases["small-tp2-2"]["status"] == "pass" and cases["small-tp2-4"]["status"] == "pass"
    first = cases["small-tp2-3"]["errors"][0]
    assert (first["rank"], first["kind"], first["step"]) == (1, "raised", "gather")


def test_a_collective_mismatch_names_the_rank_that_left_the_plan(tmp_path):
    """Rank 1 pads the all-gather differently; gloo aborts rank 0. The culprit is rank 1, named first."""
    proc, report = _suite(
        tmp_path, 2, "--impl", "faulty_sharders:MismatchedGatherOnRank1", "--timeout", "10", "--no-shrink"
    )
    assert proc.returncode == 1
    broken = _cases(report)["small-tp2-3"]
    first = broken["errors"][0]
    assert (first["rank"], first["kind"]) == (1, "mismatch"), broken["errors"]
    assert "rank 1's collective 1 (all_gather_into_tensor) has output_shape [6, 5], the plan [4, 5]" in first["message"]
    assert {v["invariant_id"] for v in broken["violations"] if v["rank"] == 1} >= {"INV-META-SCALARS"}
    assert _cases(report)["small-tp2-4"]["status"] == "pass"


def test_a_result_layout_survives_the_transcript(tmp_path):
    """The judge sees the strides a rank's result had: a column-major exchange result fails INV-A2A-LAYOUT
    in a multi-process run as it does in-process (the values alone are right)."""
    proc, report = _suite(tmp_path, 2, "--impl", "shardspec.conformance.broken.exchange:ResultInColumnMajorOrder")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    violated = {v["invariant_id"] for c in _cases(report).values() for v in c["violations"]}
    assert violated == {"INV-A2A-LAYOUT"}, violated
    assert "expected contiguous rows" in proc.stdout
