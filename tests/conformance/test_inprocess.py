"""Running, recording and judging cases in one process (no launch)."""

import json

import pytest
from harness_cases import small_cases

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.judge.checks import base
from shardspec.conformance.record import ERROR, FAIL, PASS
from shardspec.conformance.replay import run_case_in_process


@pytest.mark.parametrize("tp", [1, 2, 3])
def test_reference_passes_and_digests_are_json(tp, throwaway_checkers):
    for case in small_cases(tp):
        result = run_case_in_process(case, ImplChoice("reference"))
        assert result.status == PASS, result.errors or result.violations
    digests = throwaway_checkers[-1]
    assert sorted(digests) == list(range(tp))
    json.dumps(digests)
    assert len({d["gathered"]["sampled_token_ids"] for d in digests.values()}) == 1
    assert [w["kind"] for w in digests[0]["wire"]] == [
        "all_to_all_single",
        "all_gather_into_tensor",
        "all_gather_into_tensor",
        "all_gather_into_tensor",
    ]


def test_violation_names_rank_and_field(plugins_on_path, throwaway_checkers):
    case = small_cases(2)[1]
    result = run_case_in_process(case, ImplChoice("faulty_sharders:WrongCountsSharder"))
    assert result.status == FAIL
    assert {(v["invariant_id"], v["rank"], v["field"]) for v in result.violations} == {
        ("INV-TEST-COUNTS", 0, "num_rejected"),
        ("INV-TEST-COUNTS", 1, "num_rejected"),
    }


def test_raising_rank_is_named_with_traceback(plugins_on_path, throwaway_checkers):
    result = run_case_in_process(small_cases(2)[1], ImplChoice("faulty_sharders:RaisingSharder"))
    assert result.status == ERROR
    first = result.errors[0]
    assert (first["rank"], first["kind"], first["step"]) == (1, "raised", "gather")
    assert "deliberate failure on rank 1" in first["traceback"]
    assert [e["kind"] for e in result.errors[1:]] == ["peer"]


def test_mixed_group_of_identical_implementations_agrees(plugins_on_path, throwaway_checkers):
    case = small_cases(3)[2]
    result = run_case_in_process(case, ImplChoice("reference", "faulty_sharders:RaisingSharder"))
    assert result.status == PASS  # 4 requests: the faulty sharder behaves like the reference


def test_expected_rejection_is_judged_not_an_error(throwaway_checkers):
    from shardspec.spec.case import Case

    case = Case("reject", 2, slots=[1, 99], num_logits_per_req=[1, 1], max_num_reqs=8, expect_error="PRE-SLOT-RANGE")
    result = run_case_in_process(case, ImplChoice("reference"))
    assert result.status == PASS and not result.errors


def test_checker_that_crashes_is_reported(monkeypatch, throwaway_checkers):
    def broken(record):
        raise KeyError("oops")

    monkeypatch.setitem(base.RANK_CHECKERS, "INV-TEST-BROKEN", broken)
    result = run_case_in_process(small_cases(1)[0], ImplChoice("reference"))
    assert result.status == FAIL
    assert "checker raised KeyError" in result.violations[0]["message"]


def test_error_outside_the_implementation_is_a_harness_error_not_a_crash(monkeypatch):
    """E.g. a device error that surfaces in a checker: the case is an ERROR naming the rank."""
    from shardspec.conformance.harness import inprocess

    original = inprocess.run_case_on_rank

    def broken_harness(case, comm, *args, **kwargs):
        if comm.rank == 1:
            raise RuntimeError("device-side assert surfaced in a checker")
        return original(case, comm, *args, **kwargs)

    monkeypatch.setattr(inprocess, "run_case_on_rank", broken_harness)
    result = run_case_in_process(small_cases(2)[0], ImplChoice("reference"), timeout_s=10.0)
    assert result.status == ERROR
    harness = [e for e in result.errors if e["kind"] == "harness"]
    assert [e["rank"] for e in harness] == [1] and "device-side assert" in harness[0]["traceback"]
