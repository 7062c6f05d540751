"""The in-process torch-threads group: torch.distributed semantics, one rank at a time, no hang."""

import sys
import time

import pytest
import torch.distributed as dist
from harness_cases import small_cases

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.harness import threaded
from shardspec.conformance.record import ERROR, FAIL, PASS
from shardspec.conformance.replay import run_case_in_process

GROUP = "torch-threads"


@pytest.mark.parametrize("tp", [1, 2, 3])
def test_reference_passes_and_every_rank_records_its_wire(tp, throwaway_checkers):
    for case in small_cases(tp):
        result = run_case_in_process(case, ImplChoice("reference"), group=GROUP)
        assert result.status == PASS, result.errors or result.violations
    digests = throwaway_checkers[-1]
    assert sorted(digests) == list(range(tp))
    for digest in digests.values():
        assert [w["kind"] for w in digest["wire"]] == [
            "all_to_all_single",
            "all_gather_into_tensor",
            "all_gather_into_tensor",
            "all_gather_into_tensor",
        ]


def test_direct_torch_distributed_calls_are_recorded_per_rank(plugins_on_path):
    """The real checkers, including the wire's: they pass only if each thread's own calls were recorded."""
    impl = ImplChoice("direct_dist_sharder:DirectDistSharder")
    for case in small_cases(3):
        result = run_case_in_process(case, impl, group=GROUP)
        assert result.status == PASS, result.errors or result.violations
    lockstep = run_case_in_process(small_cases(2)[0], impl)  # no torch.distributed group there
    assert lockstep.status == ERROR and "needs comm.group" in str(lockstep.errors)


def test_violation_names_rank_and_field(plugins_on_path, throwaway_checkers):
    result = run_case_in_process(small_cases(2)[1], ImplChoice("faulty_sharders:WrongCountsSharder"), group=GROUP)
    assert result.status == FAIL
    assert {(v["invariant_id"], v["rank"], v["field"]) for v in result.violations} == {
        ("INV-TEST-COUNTS", 0, "num_rejected"),
        ("INV-TEST-COUNTS", 1, "num_rejected"),
    }


def test_rank_that_leaves_wakes_its_waiting_peers_at_once(plugins_on_path, throwaway_checkers):
    start = time.monotonic()
    result = run_case_in_process(
        small_cases(3)[1], ImplChoice("faulty_sharders:RaisingSharder"), group=GROUP, timeout_s=60
    )
    assert time.monotonic() - start < 30  # woken when rank 1 finished, not at the timeout
    assert result.status == ERROR
    by_rank = {e["rank"]: e for e in result.errors}
    assert (by_rank[1]["kind"], by_rank[1]["step"]) == ("raised", "gather")
    assert "deliberate failure on rank 1" in by_rank[1]["traceback"]
    assert {by_rank[r]["kind"] for r in (0, 2)} == {"peer"}
    assert "rank(s) [1] finished without joining" in by_rank[0]["message"]


def test_hanging_rank_is_named_after_the_timeout(plugins_on_path, throwaway_checkers, monkeypatch):
    monkeypatch.setattr(threaded, "GRACE_S", 0.2)
    result = run_case_in_process(
        small_cases(2)[1], ImplChoice("faulty_sharders:HangingSharder"), group=GROUP, timeout_s=1.0
    )
    assert result.status == ERROR
    messages = " ".join(e["message"] for e in result.errors)
    assert "rank(s) [1] did not finish within 1s" in messages


def test_the_process_is_left_as_it_was(throwaway_checkers):
    from torch.testing._internal.distributed import multi_threaded_pg

    world, join = dist.distributed_c10d._world, multi_threaded_pg.Collective.join
    gathers = (dist.all_gather_into_tensor, dist.all_to_all_single)
    excepthook = sys.excepthook
    run_case_in_process(small_cases(2)[0], ImplChoice("reference"), group=GROUP)
    assert sys.excepthook is excepthook  # creating a group wraps it with a "[rankN]" prefix
    assert dist.distributed_c10d._world is world
    assert multi_threaded_pg.Collective.join is join
    assert (dist.all_gather_into_tensor, dist.all_to_all_single) == gathers
    assert not dist.is_initialized()
