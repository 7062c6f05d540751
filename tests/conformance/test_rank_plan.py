"""The expected rejection of a case stays in the judge's process (conformance/harness/rank_plan.py): ranks get
the case under an opaque name, without its expected error, and only where each must have raised. An
implementation that reads the expected rejection from the suite's objects on its stack (the case, the
reference's expectation) and raises it unchecked forges INV-REJECT-INVALID on main; here it finds nothing
to read, goes on, and fails it."""

import json
import os
import subprocess
import sys

import pytest
from harness_cases import PLUGINS, write_cases

from shardspec.conformance.broken import cases
from shardspec.conformance.harness.expectations import compute_expectation
from shardspec.conformance.harness.rank_plan import blinded, load_plans, plan_of, save_plans

FORGER = "reads_the_expected_rejection:ReadsTheExpectedRejection"
MUST_REJECT = [cases.CAPACITY_REQS, cases.SLOT_RANGE]


def test_what_a_rank_gets_of_a_must_reject_case_names_no_precondition(tmp_path):
    case = cases.CAPACITY_REQS
    [rank_case] = blinded([case])
    assert (rank_case.case_id, rank_case.expect_error, rank_case.description) == ("case0", None, "")
    assert (rank_case.slots, rank_case.max_num_reqs) == (case.slots, case.max_num_reqs)  # the inputs, unchanged
    save_plans(tmp_path / "plans.json", [plan_of(case, compute_expectation(case, device="cpu"))])
    text = (tmp_path / "plans.json").read_text()
    assert "PRE-" not in text and case.case_id not in text
    [plan] = load_plans(tmp_path / "plans.json")
    assert all(stop is not None for stop in plan.stops)  # each rank is still stopped where it must raise


@pytest.mark.slow
def test_a_rejection_read_from_the_suites_objects_is_not_a_rejection(tmp_path):
    files = write_cases(MUST_REJECT, tmp_path)
    command = [sys.executable, "-m", "shardspec.conformance", "--impl", f"{FORGER},reference", "--no-shrink"]
    command += ["--profile", "vllm-0.34-strict"]  # where must-reject cases are inside the contract
    command += ["--json", str(tmp_path / "r.json"), "--run-dir", str(tmp_path / "run")]
    command += [arg for path in files for arg in ("--case-file", path)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    sections = {s["implementation"]: s["cases"] for s in json.loads((tmp_path / "r.json").read_text())["sections"]}
    for case in sections[FORGER]:
        assert case["status"] == "fail", case
        assert "INV-REJECT-INVALID" in {v["invariant_id"] for v in case["violations"]}, case["violations"]
    assert [c["status"] for c in sections["reference"]] == ["pass"] * len(MUST_REJECT), sections["reference"]
