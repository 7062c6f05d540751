"""Collectives and writes past torch.distributed's functions, in a real multi-process world (fork, gloo, tp 2):
on the TP group's backend object, on a gloo group an implementation builds itself, from a thread of its own,
and writes a thread makes after the step returned. Each fails its invariant; the reference passes beside
them in the same launch."""

import pytest
from harness_cases import small_cases

pytestmark = pytest.mark.slow
UNSEEN = "shardspec.conformance.broken.unseen"
# (implementation, the invariant it fails; None: it passes)
ENTRIES = [
    ("reference", None),
    # a group of its own over exactly the TP group's ranks, for every call of the step: the TP group (issue 34)
    ("shardspec.conformance.broken.conforming:EveryCallOnAGroupOfItsOwn", None),
    # the spec's calls on the TP group's backend object: the same collectives, recorded under the spec's names
    ("shardspec.conformance.broken.conforming:ExchangeOnTheBackendObject", None),
    (f"{UNSEEN}:AllReduceOnTheBackend", "INV-WIRE-SEQUENCE"),
    (f"{UNSEEN}:AllReduceOnAPrivateGlooGroup", "INV-WIRE-SEQUENCE"),
    (f"{UNSEEN}:AllReduceInAHelperThread", "INV-WIRE-SEQUENCE"),
    (f"{UNSEEN}:AllReduceInARawThread", "INV-WIRE-SEQUENCE"),
    (f"{UNSEEN}:AllReduceAfterReturning", "INV-WIRE-SEQUENCE"),
    (f"{UNSEEN}:WritesItsInputAfterReturning", "INV-INPUTS-UNCHANGED"),
    (f"{UNSEEN}:WritesItsResultAfterReturning", "INV-GATHER-RESULT-STABLE"),
    # an engine's own communicator (a stand-in for vLLM 0.34's PyNccl one), handed to the suite or not
    (f"{UNSEEN}:ExchangesThroughItsOwnCommunicator", None),
    (f"{UNSEEN}:ExtraAllReduceThroughItsOwnCommunicator", "INV-WIRE-SEQUENCE"),
    (f"{UNSEEN}:ExchangeBySendAndRecv", "INV-WIRE-SEQUENCE"),
    (f"{UNSEEN}:ExchangeNotHandedOver", "INV-WIRE-SEQUENCE"),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from shardspec.conformance.api import ImplChoice
    from shardspec.conformance.harness.group import Job
    from shardspec.conformance.harness.multiprocess import LaunchOptions, run_jobs_multiprocess
    from shardspec.conformance.replay import suite_judge

    case = small_cases(2)[0]
    jobs = [Job(ImplChoice(impl), case) for impl, _ in ENTRIES]
    run_dir = tmp_path_factory.mktemp("unseen") / "run"
    options = LaunchOptions(run_dir, case_timeout_s=60, pg_timeout_s=20, launcher="fork")
    servers: dict = {}
    try:
        found = run_jobs_multiprocess(jobs, 2, options, suite_judge(), log=lambda line: None, servers=servers)
    finally:
        for server in servers.values():
            server.close()
    return {impl: result for (impl, _), result in zip(ENTRIES, found, strict=True)}


@pytest.mark.parametrize(("impl", "invariant"), ENTRIES, ids=[impl.split(":")[-1] for impl, _ in ENTRIES])
def test_each_unseen_route_fails_its_invariant(results, impl, invariant):
    result = results[impl]
    assert not result.errors, result.errors
    violated = {v["invariant_id"] for v in result.violations}
    if invariant is None:
        assert result.status == "pass", result.violations
    else:
        assert invariant in violated, (impl, result.status, result.violations)


def test_a_rank_its_own_thread_crashes_after_the_step_is_named_in_that_case(tmp_path, monkeypatch):
    """The rank has returned every step (its record is out) when its thread kills it: the case it ran is the
    one that fails, naming the rank and where, not the next one."""
    import os

    from harness_cases import PLUGINS

    from shardspec.conformance.api import ImplChoice
    from shardspec.conformance.harness.group import Job
    from shardspec.conformance.harness.multiprocess import LaunchOptions, run_jobs_multiprocess
    from shardspec.conformance.replay import suite_judge

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
    cases = small_cases(2)[:2]
    jobs = [Job(ImplChoice("hostile_sharders:SegfaultAfterReturning"), case) for case in cases]
    options = LaunchOptions(tmp_path / "run", case_timeout_s=60, pg_timeout_s=20, launcher="fork")
    servers: dict = {}
    try:
        first, *_ = run_jobs_multiprocess(jobs, 2, options, suite_judge(), log=lambda line: None, servers=servers)
    finally:
        for server in servers.values():
            server.close()
    assert first.status == "error", (first.status, first.errors)
    assert any("rank 1" in error["message"] and "after the gather" in error["message"] for error in first.errors)
