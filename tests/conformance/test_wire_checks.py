"""The wire checkers judge send buffers, receive shapes and the sequence, and name what differs."""

from dataclasses import replace

import pytest

from shardspec.conformance.broken import cases
from shardspec.conformance.harness.expectations import reference_factory
from shardspec.conformance.judge.checks.all_to_all import check_a2a_splits
from shardspec.conformance.judge.checks.base import StepRecord
from shardspec.conformance.judge.checks.wire import check_wire_logprobs, check_wire_sampled, sequence_difference
from shardspec.conformance.judge.rank import rank_checks
from shardspec.conformance.replay import step_records
from shardspec.spec.case import Case

A2A, GATHER = "all_to_all_single", "all_gather_into_tensor"


def _reference_records(case: Case) -> list[StepRecord]:
    return step_records(case, reference_factory)


@pytest.fixture(scope="module")
def spec_record():
    return _reference_records(cases.STRIDED_INPUTS)[0]


def _with_call(record: StepRecord, index: int, **changes) -> StepRecord:
    wire = list(record.actual.wire)
    wire[index] = replace(wire[index], **changes)
    return replace(record, actual=replace(record.actual, wire=wire))


def test_reference_records_pass(spec_record):
    assert rank_checks(spec_record)[0] == []


def test_a2a_send_buffer_must_be_the_callers_logits_shard(spec_record):
    send = spec_record.actual.wire[0].send.clone()
    send[1, 0] += 1.0
    (violation,) = check_a2a_splits(_with_call(spec_record, 0, send=send))
    assert violation.field == "wire.all_to_all" and "send row 1" in violation.message
    # Owner-sorted row 1 on SPEC's batch belongs to request 0 (two rows, rank 0 first).
    assert violation.request == 0


def test_a2a_send_dtype_follows_the_logits(spec_record):
    send = spec_record.actual.wire[0].send.double()
    (violation,) = check_a2a_splits(_with_call(spec_record, 0, send=send))
    assert "torch.float64" in violation.message and "torch.float32" in violation.message


def test_a2a_receive_shape(spec_record):
    rows, width = spec_record.actual.wire[0].output_shape
    (violation,) = check_a2a_splits(_with_call(spec_record, 0, output_shape=(rows + 1, width)))
    assert "receives into" in violation.message


@pytest.mark.parametrize(
    "index, checker", [(1, check_wire_sampled), (2, check_wire_logprobs), (3, check_wire_logprobs)]
)
def test_all_gather_receive_shapes(spec_record, index, checker):
    rows, cols = spec_record.actual.wire[index].output_shape
    (violation,) = checker(_with_call(spec_record, index, output_shape=(rows // spec_record.case.tp_size, cols)))
    assert "receives into" in violation.message and "tp_size times" in violation.message


@pytest.mark.parametrize(
    "kinds, difference",
    [
        ([A2A, "barrier", GATHER], "extra barrier at position 1"),
        (["all_reduce", A2A, GATHER], "extra all_reduce at position 0"),
        ([A2A, GATHER, "send"], "extra send at position 2"),
        ([GATHER], f"missing {A2A} at position 0"),
        ([A2A], f"missing {GATHER} at position 1"),
        ([A2A, "all_gather"], f"all_gather at position 1 where {GATHER} belongs"),
    ],
)
def test_sequence_difference_names_the_call(kinds, difference):
    assert sequence_difference(kinds, [A2A, GATHER]) == difference


OWN = "a group of the TP group's world ranks [0, 1] built by the implementation ('7')"


@pytest.fixture(scope="module")
def spec_digests():
    from shardspec.conformance.judge.checks.digest import rank_digest

    records = _reference_records(cases.STRIDED_INPUTS)
    return records[0].case, {record.rank: rank_digest(record) for record in records}


def _on_groups(digests: dict, groups) -> dict:
    """``digests`` with each rank's calls on ``groups(rank, position)`` (None: the TP group)."""
    return {
        rank: {**digest, "wire": [{**call, "group": groups(rank, i)} for i, call in enumerate(digest["wire"])]}
        for rank, digest in digests.items()
    }


def test_a_group_of_the_tp_ranks_used_for_the_whole_step_on_every_rank_is_the_tp_group(spec_digests):
    from shardspec.conformance.judge.checks.wire import check_wire_sequence

    case, digests = spec_digests
    assert list(check_wire_sequence(case, digests)) == []
    assert list(check_wire_sequence(case, _on_groups(digests, lambda rank, position: OWN))) == []


def test_a_step_split_between_the_tp_group_and_a_group_of_its_own_fails(spec_digests):
    from shardspec.conformance.judge.checks.wire import check_wire_sequence

    case, digests = spec_digests
    split = _on_groups(digests, lambda rank, position: OWN if position else None)
    (violation, *_) = check_wire_sequence(case, split)
    assert violation.invariant_id == "INV-WIRE-SEQUENCE"
    assert f"collective 1 ({GATHER}) was issued on {OWN}, collective 0 on the TP group" in violation.message


def test_ranks_on_different_groups_of_the_same_ranks_fail(spec_digests):
    """A mixed group whose odd ranks exchange on a group of their own: the even ranks never meet them."""
    from shardspec.conformance.judge.checks.wire import check_wire_sequence

    case, digests = spec_digests
    (violation,) = check_wire_sequence(case, _on_groups(digests, lambda rank, position: OWN if rank % 2 else None))
    assert violation.rank == 1 and "'group'" in violation.message and "collective 0" in violation.message
