"""An implementation that crashes in every case costs a few relaunches, not one per case."""

import json
import os
import subprocess
import sys

import pytest
from harness_cases import PLUGINS, small_cases, write_cases

from shardspec.conformance.harness.crashes import CrashBudget, crash_of
from shardspec.conformance.record import ERROR, PASS, CaseResult
from shardspec.spec.case import Case


def _result(case_id: str, impl: str, kind: str, step: str) -> CaseResult:
    case = Case(case_id, 2, slots=[0], num_logits_per_req=[1])
    return CaseResult(case, impl, ERROR, errors=[{"rank": 1, "kind": kind, "step": step, "message": "..."}])


def test_the_budget_is_spent_by_cases_that_end_alike_only():
    budget = CrashBudget(max_crashes=2)
    budget.note(_result("a", "x", "died", "gather"))
    budget.note(_result("b", "x", "timeout", "gather"))  # a hang is another way to end
    budget.note(_result("c", "x", "died", "shard"))  # another step
    budget.note(_result("d", "y", "died", "gather"))  # another entry
    budget.note(_result("e", "x", "raised", "gather"))  # raised errors never end a launch
    assert budget.spent("x", 2) is None and budget.spent("y", 2) is None
    budget.note(_result("f", "x", "died", "gather"))
    reason = budget.spent("x", 2)
    assert reason is not None and "2 cases of x at tp 2 ended alike (a rank died in step gather: a, f)" in reason
    assert budget.spent("y", 2) is None


def test_no_budget_never_stops_an_entry():
    budget = CrashBudget(max_crashes=0)
    for n in range(5):
        budget.note(_result(f"c{n}", "x", "died", "gather"))
    assert budget.spent("x", 2) is None
    assert crash_of(CaseResult(Case("p", 2, slots=[0], num_logits_per_req=[1]), "x", PASS)) is None


@pytest.mark.slow
def test_after_two_alike_crashes_the_rest_of_the_entry_is_not_run_and_the_reference_still_is(tmp_path):
    files = write_cases(small_cases(2), tmp_path)  # three cases
    command = [sys.executable, "-m", "shardspec.conformance", "--impl", "hostile_sharders:ExitInEveryGather,reference"]
    command += ["--max-crashes", "2", "--timeout", "10", "--no-shrink", "--json", str(tmp_path / "r.json")]
    command += [arg for path in files for arg in ("--case-file", path)]
    env = {**os.environ, "PYTHONPATH": str(PLUGINS)}
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    sections = {s["implementation"]: s["cases"] for s in report["sections"]}
    crashing = sections["hostile_sharders:ExitInEveryGather"]
    statuses = [c["status"] for c in crashing]
    assert statuses[:2] == ["error", "error"] and set(statuses[2:]) == {"not-run"}, statuses
    assert all("ended alike (a rank died in step gather" in c["reason"] for c in crashing[2:]), crashing[2:]
    assert {c["status"] for c in sections["reference"]} == {"pass"}
    # Two crashes, two relaunches at the most: the launch lines of the run's log say so.
    assert proc.stdout.count("  launch ") <= 3, proc.stdout


def _rejecting(case_id: str, impl: str, kind: str, step: str) -> CaseResult:
    result = _result(case_id, impl, kind, step)
    result.case.expect_error = "PRE-CAPACITY-REQS"
    return result


def test_crashes_on_invalid_input_cases_stop_only_invalid_input_cases():
    """vLLM's file aborts on several inputs it must reject (it trusts its scheduler): its valid cases still
    run, and a valid case's crashes still stop every case."""
    budget = CrashBudget(max_crashes=2)
    budget.note(_rejecting("r1", "x", "died", "shard"))
    budget.note(_rejecting("r2", "x", "died", "shard"))
    assert budget.spent("x", 2) is None
    reason = budget.spent("x", 2, invalid=True)
    assert reason is not None and "2 invalid-input cases of x at tp 2 ended alike" in reason
    budget.note(_result("v1", "x", "died", "shard"))
    assert budget.spent("x", 2) is None  # one valid crash: not alike enough yet
    budget.note(_result("v2", "x", "died", "shard"))
    assert "2 cases of x at tp 2 ended alike (a rank died in step shard: v1, v2)" in budget.spent("x", 2)
