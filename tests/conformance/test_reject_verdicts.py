"""Must-reject cases an implementation does not reject: failures of INV-REJECT-INVALID, never run errors.

One multi-process run (the mode where a rank that goes on past the rejection used to leave its peers
waiting in a collective until the case timed out) of two implementations that accept invalid inputs:
on every rank, or on odd ranks only while even ranks reject. Its xfails file lists INV-REJECT-INVALID,
so the run passes only if every such case is that failure and nothing else.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ENTRIES = ["ChecksNothing", "AcceptsOnOddRanks"]
# Fixture case -> what rank 1 of AcceptsOnOddRanks is told (the reference rejects on every rank).
CASES = {
    "tp2-reject-grammar-bitmask": "inputs violating PRE-GRAMMAR-BITMASK were accepted on rank 1: the rank "
    "returned from step shard instead of raising in step shard after 0 collective(s)",
    "tp2-reject-logits-shard": "inputs violating PRE-LOGITS-SHARD were accepted on rank 1: the rank went on to "
    "issue collective 0 (all_to_all_single) instead of raising in step all_to_all after 0 collective(s)",
    # Unchecked, these inputs make the reference's own code raise: not the precondition's error.
    "tp2-reject-batch-size": "the error does not name PRE-BATCH-SIZE: IndexError",
}
TIMEOUT_S = 20


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reject")
    (folder / "xfails.yaml").write_text("INV-REJECT-INVALID: accepted on purpose\n")
    impls = ",".join(f"shardspec.conformance.broken.rejection:{name}" for name in ENTRIES)
    command = [sys.executable, "-m", "shardspec.conformance", "--impl", impls, "--timeout", str(TIMEOUT_S)]
    command += ["--profile", "vllm-0.34-strict"]  # where must-reject cases are inside the contract
    command += ["--xfails-file", str(folder / "xfails.yaml"), "--json", str(folder / "r.json")]
    command += [arg for case_id in CASES for arg in ("--case", case_id)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    report = json.loads((folder / "r.json").read_text())
    sections = {s["implementation"]: {c["case_id"]: c for c in s["cases"]} for s in report["sections"]}
    return proc, sections


def test_a_known_failures_entry_covers_them(run):
    proc, sections = run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # No rank waited for a peer that had stopped: every step ended well before the timeout. Judged by each
    # case's own step times, not the run's wall time, which grows with the entries' launches and the load.
    for cases in sections.values():
        for case_id, case in cases.items():
            slowest = max(case["timings"].values(), default=0.0)
            assert slowest < TIMEOUT_S, f"{case_id}: a rank waited for a peer that had stopped ({case['timings']})"


@pytest.mark.parametrize("name", ENTRIES)
@pytest.mark.parametrize("case_id", CASES)
def test_each_case_fails_inv_reject_invalid_only(run, name, case_id):
    case = run[1][f"shardspec.conformance.broken.rejection:{name}"][case_id]
    assert (case["status"], case["errors"]) == ("fail", []), case
    assert {v["invariant_id"] for v in case["violations"]} == {"INV-REJECT-INVALID"}
    assert f"--case {case_id}" in case["reproduce"]


@pytest.mark.parametrize("case_id", CASES)
def test_the_rank_that_went_on_is_named_with_the_precondition_and_step(run, case_id):
    case = run[1]["shardspec.conformance.broken.rejection:AcceptsOnOddRanks"][case_id]
    assert [v["rank"] for v in case["violations"]] == [1], case["violations"]  # rank 0 rejects as it must
    assert case["violations"][0]["message"].startswith(CASES[case_id]), case["violations"][0]
