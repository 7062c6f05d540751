"""How checkers report: once per unexpected exception, naming request and field, across ranks."""

import json

import pytest
from bundled import VLLM_SEED

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.broken import BY_NAME, cases
from shardspec.conformance.judge.checks import GROUP_CHECKERS
from shardspec.conformance.judge.checks.base import STEP_REPORTER, StepRecord
from shardspec.conformance.judge.checks.digest import rank_digest
from shardspec.conformance.judge.rank import rank_checks
from shardspec.conformance.replay import run_case_in_process, step_records
from shardspec.reference import ReferenceSharder
from shardspec.spec.case import Case
from shardspec.spec.profiles import rules_of

# A group of one under vllm-seed, which builds its sharder (vllm-0.33 and vllm-0.34 refuse it: PRE-TP-SIZE).
TP1 = Case(case_id="tp1", tp_size=1, slots=[0, 1, 2], num_logits_per_req=[1, 2, 1], rules=rules_of(VLLM_SEED))


def _raising_in(method: str):
    class Raising(ReferenceSharder):
        pass

    def fail(self, *args, **kwargs):
        raise RuntimeError(f"deliberate failure in {method}")

    setattr(Raising, method, fail)
    return Raising


def _records(case: Case, factory) -> list[StepRecord]:
    return step_records(case, factory)


@pytest.mark.parametrize(
    "method, step",
    [("shard_sampler_inputs", "shard"), ("all_to_all_logits", "all_to_all"), ("gather_sampler_output", "gather")],
)
def test_unexpected_exception_is_reported_once_under_its_step(method, step):
    (record,) = _records(TP1, _raising_in(method))
    violations = rank_checks(record)[0]
    assert [v.invariant_id for v in violations] == [STEP_REPORTER[step]]
    assert "deliberate failure" in violations[0].message


def test_reference_records_have_no_violations_and_digests_are_json():
    records = _records(cases.SPEC, ReferenceSharder)
    assert all(rank_checks(record)[0] == [] for record in records)
    digests = {record.rank: rank_digest(record) for record in records}
    json.dumps(digests)
    for checker in GROUP_CHECKERS.values():
        assert list(checker(cases.SPEC, digests)) == []


def test_violation_names_first_offending_request_and_field():
    result = run_case_in_process(cases.SPEC, ImplChoice(BY_NAME["counts-swapped"].target))
    counts = [v for v in result.violations if v["invariant_id"] == "INV-GATHER-COUNTS"]
    assert {(v["rank"], v["field"]) for v in counts} == {
        (rank, f"gathered.{name}") for rank in (0, 1) for name in ("num_sampled", "num_rejected")
    }
    # Toy sampling of SPEC: num_sampled [2, 1, 1, 1, 2], num_rejected [0, 0, 2, 0, 0]; request 0 differs first.
    sampled = [v for v in counts if v["field"] == "gathered.num_sampled"]
    assert all(v["request"] == 0 and "row 0 is 0, expected 2" in v["message"] for v in sampled)


def test_owner_violation_names_the_misplaced_request():
    result = run_case_in_process(cases.DECODE, ImplChoice(BY_NAME["owner-slot-division"].target))
    owner = [v for v in result.violations if v["invariant_id"] == "INV-OWNER"]
    slots = cases.DECODE.slots
    for v in owner:
        request = v["request"]
        assert (slots[request] % 2 == v["rank"]) != ((slots[request] // 2) % 2 == v["rank"])


def test_device_copy_and_host_copy_are_each_judged():
    device = run_case_in_process(cases.SPEC, ImplChoice(BY_NAME["cu-num-logits-device-off-by-one"].target))
    host = run_case_in_process(cases.DECODE, ImplChoice(BY_NAME["idx-mapping-host-stale"].target))
    assert {v["field"] for v in device.violations} == {"local_batch.cu_num_logits"}
    assert {v["field"] for v in host.violations} == {"local_batch.idx_mapping_np"}


def _digests(case: Case):
    return {record.rank: rank_digest(record) for record in _records(case, ReferenceSharder)}


def test_rank_agreement_ignores_per_rank_metadata_but_not_results():
    digests = _digests(cases.DECODE)
    assert digests[0]["metadata"]["num_local_reqs"] != digests[1]["metadata"]["num_local_reqs"]
    check = GROUP_CHECKERS["INV-RANK-AGREEMENT"]
    assert list(check(cases.DECODE, digests)) == []
    digests[1]["gathered"]["num_sampled"] = "int32[5]@cpu:0000"
    (violation,) = check(cases.DECODE, digests)
    assert (violation.rank, violation.field) == (1, "gathered.num_sampled")


def test_wire_sequence_flags_a_rank_with_other_shapes_or_kinds():
    check = GROUP_CHECKERS["INV-WIRE-SEQUENCE"]
    digests = _digests(cases.DECODE)
    digests[1]["wire"][1]["send_shape"] = [9, 9]
    (violation,) = check(cases.DECODE, digests)
    assert violation.rank == 1 and "collective 1" in violation.message
    digests = _digests(cases.DECODE)
    digests[0]["wire"].pop()
    (violation,) = check(cases.DECODE, digests)
    assert violation.rank == 0


class _GatherReturnsNothing(ReferenceSharder):
    def gather_sampler_output(self, *args, **kwargs):
        super().gather_sampler_output(*args, **kwargs)


def test_a_gather_that_returns_nothing_is_a_violation():
    (record,) = _records(TP1, _GatherReturnsNothing)
    assert [v.invariant_id for v in rank_checks(record)[0]] == ["INV-GATHER-SAMPLED-IDS"]


def test_value_messages_summarise_the_differing_rows_not_whole_tensors():
    import torch

    from shardspec.conformance.judge.checks.common import diff_summary, values_equal

    expected = torch.arange(1000).reshape(500, 2)
    actual = expected.clone()
    actual[[3, 70, 71, 400]] += 1
    message = diff_summary(actual, expected, values_equal(actual, expected))
    assert message == (
        "row 3 is [7, 8], expected [6, 7]; row 70 is [141, 142], expected [140, 141]; "
        "row 71 is [143, 144], expected [142, 143] (4 of 500 rows differ)"
    )
