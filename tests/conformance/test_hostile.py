"""Hostile implementations: each gets its exact verdict, the run goes on and ends in bounded time.

One command-line run judges every entry, each in rank processes of its own; the
assertions below read its JSON report.
"""

import json
import os
import subprocess
import sys
import time

import pytest
from harness_cases import PLUGINS, small_cases, write_cases

pytestmark = pytest.mark.slow

MODULE = "hostile_sharders"
ENTRIES = [
    "SegfaultInGather",
    "AbortInGather",
    "ExitInGather",
    "ExitOnRankZeroInGather",
    "StopInGather",
    "GilHangInGather",
    "FloodAndLeakInGather",
    "HugeAllocationInGather",
    "CutsItsTranscriptInGather",
    "ObjectArrayInResult",
    "UnsupportedDtypeInResult",
    "ReversedIdsUnchecked",
]
TIMEOUT_S = 6
BOUND_S = 200  # every launch, relaunch and the parent's watchdog, on 2 busy cores


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    files = write_cases(small_cases(2), folder)
    impls = [f"{MODULE}:{name}" for name in ENTRIES] + ["exits_at_import:X", "raises_at_import:X", "reference"]
    command = [
        sys.executable,
        "-m",
        "shardspec.conformance",
        "--impl",
        ",".join(impls),
        "--timeout",
        str(TIMEOUT_S),
        "--no-shrink",
        "--json",
        str(folder / "r.json"),
        "--run-dir",
        str(folder / "run"),
    ]
    command += [arg for path in files for arg in ("--case-file", path)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
    start = time.monotonic()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=BOUND_S + 60)
    wall = time.monotonic() - start
    report = json.loads((folder / "r.json").read_text())
    sections = {s["implementation"]: {c["case_id"]: c for c in s["cases"]} for s in report["sections"]}
    return proc, wall, sections


def _culprit(sections, name):
    case = sections[f"{MODULE}:{name}"]["small-tp2-3"]
    assert case["status"] == "error", case
    return case["errors"][0]


def test_the_run_fails_within_its_bound(run):
    proc, wall, _ = run
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert wall < BOUND_S


@pytest.mark.parametrize(
    "name, how",
    [
        ("SegfaultInGather", "was killed by SIGSEGV"),
        ("AbortInGather", "was killed by SIGABRT"),
        ("ExitInGather", "exited with status 3"),
    ],
)
def test_a_dying_rank_is_named_with_its_signal_and_step(run, name, how):
    error = _culprit(run[2], name)
    assert (error["rank"], error["kind"], error["step"]) == (1, "died", "gather"), error
    assert f"rank 1 {how} in step gather of case small-tp2-3" in error["message"]


def test_when_rank_0_exits_it_is_the_culprit_and_its_peer_fails_no_invariant(run):
    """Rank 0's sys.exit: rank 0 is named (died, step gather), and rank 1, whose collective broke, gets no
    invariant failure (it was reported as INV-REJECT-INVALID of rank 1)."""
    case = run[2][f"{MODULE}:ExitOnRankZeroInGather"]["small-tp2-3"]
    assert case["status"] == "error" and not case["violations"], case
    first = case["errors"][0]
    assert (first["rank"], first["kind"], first["step"]) == (0, "died", "gather"), case["errors"]
    assert "rank 0 exited with status 3 in step gather of case small-tp2-3" in first["message"]
    assert all(e["kind"] in ("stopped", "peer", "peer-timeout") for e in case["errors"] if e["rank"] == 1), case


@pytest.mark.parametrize("name", ["StopInGather", "GilHangInGather"])
def test_a_rank_out_of_reach_of_its_own_watchdog_is_stopped_by_the_parent(run, name):
    case = run[2][f"{MODULE}:{name}"]["small-tp2-3"]
    assert case["status"] == "error"
    messages = " ".join(e["message"] for e in case["errors"])
    # Rank 1's watchdog thread stops touching its heartbeat file; the parent ends the launch 3 s later
    # (below --timeout here), before rank 0's collective gives up at its process-group timeout.
    assert "rank(s) 1 stopped running Python for 3s or more (their watchdog thread could not run)" in messages
    if name == "StopInGather":
        assert "rank(s) 1 stopped by a signal" in messages
    # The rank that never came back is named first, with its step; its peer waited for it in a collective.
    first = case["errors"][0]
    assert (first["rank"], first["kind"], first["step"]) == (1, "timeout", "gather"), case["errors"]
    assert "rank 1 did not return in step gather of case small-tp2-3" in first["message"]
    # Whichever comes first ends the peer: the parent stops it while it waits (peer-timeout), or its own
    # collective times out and raises (peer). Either way it is not the culprit, and its step is named.
    peer = next(e for e in case["errors"] if e["rank"] == 0)
    assert (peer["kind"], peer["step"]) in {("peer-timeout", "gather"), ("peer", "gather")}, peer
    assert "all_gather_into_tensor" in peer["message"], peer


@pytest.mark.parametrize("name", ENTRIES[:-1])
def test_the_other_cases_of_a_hostile_entry_still_pass(run, name):
    cases = run[2][f"{MODULE}:{name}"]
    assert cases["small-tp2-2"]["status"] == "pass", cases["small-tp2-2"]
    if name == "FloodAndLeakInGather":
        assert {c["status"] for c in cases.values()} == {"pass"}


def test_a_huge_allocation_is_a_raised_error_of_its_rank(run):
    error = _culprit(run[2], "HugeAllocationInGather")
    assert (error["rank"], error["kind"], error["step"]) == (1, "raised", "gather")


@pytest.mark.parametrize(
    "name, what",
    [
        ("ObjectArrayInResult", "rank 1's gathered.num_nans could not be decoded: a numpy array of dtype object"),
        ("UnsupportedDtypeInResult", "rank 1's gathered.num_nans could not be decoded: a tensor of dtype complex128"),
        # What it wrote, and every frame after it (the header claims 2**40 bytes), is the cut frame.
        ("CutsItsTranscriptInGather", "rank 1's transcript is cut: its last frame ends after "),
    ],
)
def test_a_result_that_cannot_reach_the_judge_is_an_error_of_its_rank_and_case(run, name, what):
    """Which case, which rank, what could not be decoded and why: in the JSON and in the terminal report."""
    proc, _, sections = run
    error = _culprit(sections, name)
    assert (error["rank"], error["kind"]) == (1, "undecodable"), error
    assert error["message"].startswith(what), error["message"]
    assert f"rank 1 [undecodable]: {what}" in proc.stdout


def test_emptying_the_checkers_at_import_changes_no_verdict(run):
    cases = run[2][f"{MODULE}:ReversedIdsUnchecked"]
    failing = {v["invariant_id"] for c in cases.values() for v in c["violations"]}
    assert "INV-GATHER-SAMPLED-IDS" in failing


@pytest.mark.parametrize(
    "module, reason",
    [
        ("exits_at_import", "importing it ended the process (exited with status 7"),
        ("raises_at_import", "this module cannot be imported"),
    ],
)
def test_an_import_failure_fails_only_its_entry(run, module, reason):
    cases = run[2][f"{module}:X"]
    assert {c["status"] for c in cases.values()} == {"not-run"}
    assert all(reason in c["reason"] for c in cases.values()), cases
    assert {c["status"] for c in run[2]["reference"].values()} == {"pass"}


def test_a_crash_while_shrinking_ends_the_child_not_the_run(tmp_path, monkeypatch, plugins_on_path):
    """Shrinking replays the implementation in one child process; a segfault there is an error to report."""
    from shardspec.conformance.api import ImplChoice
    from shardspec.conformance.cases.shrink import signature
    from shardspec.conformance.replay import run_case_in_process, shrink_in_child

    entry = "faulty_sharders:WrongIdsThenCrashWhenSmall"
    case = small_cases(2)[1]  # 3 requests: ids reversed; every smaller variant segfaults
    target = signature(run_case_in_process(case, ImplChoice(entry)))
    assert "INV-GATHER-SAMPLED-IDS" in target
    with pytest.raises(RuntimeError, match="the shrinking process was killed by SIGSEGV"):
        shrink_in_child(case, target, entry, "lockstep", "cpu", tmp_path / "shrinking")
