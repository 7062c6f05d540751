"""examples/upstream_vllm: vLLM's batch_shard.py run by the suite without vLLM installed.

The file itself is not part of this repository; a file shaped like it
(``plugins/vllm_style_batch_shard.py``) stands in, so these tests check the
adapter's wiring: the vLLM stand-in modules, the collectives routed to each
rank's communicator, and one tensor-parallel group per rank thread.
"""

import pathlib
import sys
from dataclasses import replace

import pytest
import vllm_files
from harness_cases import PLUGINS, small_cases

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.record import PASS
from shardspec.conformance.replay import run_case_in_process
from shardspec.spec.profiles import DEFAULT_PROFILE, rules_of
from shardspec.spec.rules import Rules

ADAPTER = pathlib.Path(__file__).resolve().parents[2] / "examples" / "upstream_vllm"
STAND_IN = PLUGINS / "vllm_style_batch_shard.py"


@pytest.fixture
def adapter(monkeypatch):
    monkeypatch.syspath_prepend(str(ADAPTER))
    monkeypatch.setenv("SHARDSPEC_UPSTREAM_FILE", str(STAND_IN))
    import shardspec_upstream

    yield shardspec_upstream
    sys.modules.pop("shardspec_upstream", None)


# The stand-in's own rules: the default profile's, building a sharder of any group (vLLM's file does; its engine's
# config refuses a group of one). At tp 1 the cases are judged under them: every bundled profile of those rules
# refuses a group of one (PRE-TP-SIZE), and vllm-seed's are another engine's.
STAND_IN_RULES = Rules.of("stand-in", {**rules_of(DEFAULT_PROFILE).as_dict(), "construction": "any_group"})


@pytest.mark.parametrize("tp", [1, 2, 3])
def test_suite_passes_a_vllm_style_file_through_the_adapter(adapter, tp):
    for case in small_cases(tp):
        case = replace(case, rules=STAND_IN_RULES) if tp < rules_of(DEFAULT_PROFILE).min_tp else case
        result = run_case_in_process(case, ImplChoice("shardspec_upstream:make_sharder"))
        assert result.status == PASS, result.errors or result.violations


def test_the_file_sees_its_own_rank_in_each_thread(adapter):
    from shardspec.comm import LockstepGroup

    group = LockstepGroup(2)
    sharders = [adapter.make_sharder(8, 2, comm=group.comm(rank)) for rank in range(2)]
    with sharders[1]._rank():
        assert adapter.get_tp_group().rank_in_group == 1
        with sharders[0]._rank():
            assert adapter.get_tp_group().rank_in_group == 0
        assert adapter.get_tp_group().rank_in_group == 1


def test_missing_file_is_named(adapter, monkeypatch, tmp_path):
    monkeypatch.delenv("SHARDSPEC_UPSTREAM_FILE")
    with pytest.raises(RuntimeError, match="SHARDSPEC_UPSTREAM_FILE"):
        adapter.load_upstream()
    with pytest.raises(FileNotFoundError, match="no-such-file.py"):
        adapter.load_upstream(str(tmp_path / "no-such-file.py"))


def test_outside_a_sharder_call_there_is_no_group(adapter):
    with pytest.raises(RuntimeError, match="outside an UpstreamSharder call"):
        adapter.get_tp_group()


VLLM_033_FILE = vllm_files.batch_shard_file("0.33.0")  # from its wheel or a copy (tests/vllm_files.py)


@vllm_files.needs("0.33.0")
@pytest.mark.parametrize("case_id", ["tp2-admitted-drafts", "tp4-adaptive-budget-not-binding", "tp2-decode"])
def test_the_adapter_runs_vllm_033s_file(monkeypatch, case_id):
    """A later revision: its BatchSharder takes adaptive_verification_enabled and waits for admitted counts."""
    from shardspec.fixtures import load_case

    monkeypatch.syspath_prepend(str(ADAPTER))
    monkeypatch.setenv("SHARDSPEC_UPSTREAM_FILE", str(VLLM_033_FILE))
    try:
        result = run_case_in_process(load_case(case_id, "vllm-0.33"), ImplChoice("shardspec_upstream:make_sharder"))
    finally:
        sys.modules.pop("shardspec_upstream", None)
    assert result.status == PASS, result.errors or result.violations


VLLM_034_FILE = vllm_files.batch_shard_file("0.34.0")


@vllm_files.needs("0.34.0")
@pytest.mark.parametrize("tp", [2, 3])  # vLLM 0.34's config builds no sharder of one rank (the next test)
def test_the_adapter_runs_vllm_034s_file_through_its_pynccl_branch(monkeypatch, tp):
    """0.34: all_to_all_vocab_shards through the TP group's device_communicator.pynccl_comm, ownership by batch
    position (no DraftLogitsCache), and vllm.config imported: the small cases pass under vllm-0.34, and every
    exchange went through the PyNccl stand-in (one call per rank)."""
    monkeypatch.syspath_prepend(str(ADAPTER))
    monkeypatch.setenv("SHARDSPEC_UPSTREAM_FILE", str(VLLM_034_FILE))
    import shardspec_upstream

    calls = []
    through = shardspec_upstream._PyNcclOfTheGroup.all_to_all_single
    monkeypatch.setattr(
        shardspec_upstream._PyNcclOfTheGroup,
        "all_to_all_single",
        lambda self, *args: calls.append(self.comm.rank) or through(self, *args),
    )
    try:
        for case in small_cases(tp):
            result = run_case_in_process(
                replace(case, rules=rules_of("vllm-0.34")), ImplChoice("shardspec_upstream:make_sharder")
            )
            assert result.status == PASS, result.errors or result.violations
    finally:
        sys.modules.pop("shardspec_upstream", None)
    assert sorted(calls) == sorted(list(range(tp)) * len(small_cases(tp)))


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.34"])
@pytest.mark.parametrize(
    ("tp", "max_num_reqs", "refused"), [(1, 4, "PRE-TP-SIZE"), (2, 1, "PRE-CAPACITY-TP"), (3, 2, "PRE-CAPACITY-TP")]
)
def test_the_adapter_refuses_what_vllms_config_refuses(monkeypatch, profile, tp, max_num_reqs, refused):
    """Under construction: sharded_groups (vllm-0.33, vllm-0.34: 0.33.0's config refuses them as 0.34.0's does)
    the stand-in refuses, as vLLM's config does before any BatchSharder exists, a group of one and fewer
    requests than ranks; under any_group (vllm-seed) it refuses neither."""
    from types import SimpleNamespace

    from shardspec.spec.errors import PreconditionError

    monkeypatch.syspath_prepend(str(ADAPTER))
    import shardspec_upstream

    comm = SimpleNamespace(world_size=tp, rank=0)
    with pytest.raises(PreconditionError) as raised:
        shardspec_upstream.UpstreamSharder(max_num_reqs, 2, comm=comm, rules=rules_of(profile))
    assert raised.value.precondition_id == refused
    with pytest.raises(RuntimeError, match="SHARDSPEC_UPSTREAM_FILE"):  # past the refusal: the file is asked for
        monkeypatch.delenv("SHARDSPEC_UPSTREAM_FILE", raising=False)
        shardspec_upstream.UpstreamSharder(max_num_reqs, 2, comm=comm, rules=rules_of("vllm-seed"))


@pytest.mark.parametrize("path", sorted(ADAPTER.glob("known_failures_*.yaml")), ids=lambda p: p.name)
def test_the_known_failures_are_keyed_by_property_and_name_real_invariants(path):
    """Per release, keyed by invariant and case property (never a generated case's id, which changes with the
    case selection and the device), each entry a defect of vLLM's: what its engine never sends is outside the
    profile's contract, and what its config refuses the adapter refuses, so no entry is a choice of the spec's."""
    from shardspec.conformance.report.known_failures import NOT_RUN, RUN_ERROR
    from shardspec.conformance.report.xfails import load_xfails
    from shardspec.spec.loader import load_spec

    xfails = load_xfails(str(path))
    assert not xfails.entries, f"entries keyed by id or bare invariant: {sorted(xfails.entries)}"
    invariants = {inv.id for inv in load_spec().invariants} | {RUN_ERROR, NOT_RUN}
    for item in xfails.known:
        assert set(item.invariants) <= invariants, item.label
        assert item.why == "vllm-defect", item.label
        assert not (item.when.get("case") and any("gen-" in c for c in item.when["case"])), item.label


def test_every_release_the_adapter_runs_has_its_known_failures():
    assert {p.name for p in ADAPTER.glob("known_failures*.yaml")} == {
        "known_failures_seed.yaml",
        "known_failures_0.33.yaml",
        "known_failures_0.34.yaml",
    }
