"""Invalid inputs: rejected in the operation the precondition constrains, with an error naming it.

Both checkers judge only cases with ``expect_error`` set, and only on the ranks where the reference
itself rejects the input: a rank-local violation is visible on its rank only (CL-REJECTION-RANKS), and
on the others an error may just follow a peer leaving a collective. Which preconditions must be
rejected is read from the spec (``on_violation.outcome``).
"""

from __future__ import annotations

from collections.abc import Iterable

from shardspec.conformance.judge.checks.base import StepRecord, Violation, rank_check
from shardspec.spec.errors import names_precondition
from shardspec.spec.loader import must_reject_ids

# The preconditions whose violation must be rejected (never truncated, wrapped or passed on).
ALWAYS_REJECTED = must_reject_ids()


def _reference_rejects(record: StepRecord) -> bool:
    """The reference rejects this rank's inputs with the case's precondition: only then is there a rejection
    to judge on this rank."""
    return record.case.expect_error is not None and names_precondition(record.expected.error, record.case.expect_error)


@rank_check(
    "INV-REJECT-INVALID",
    applies=lambda record: record.case.expect_error in ALWAYS_REJECTED and _reference_rejects(record),
)
def check_reject_invalid(record: StepRecord) -> Iterable[Violation]:
    expected_id = record.case.expect_error
    reference = record.expected
    if expected_id not in ALWAYS_REJECTED or not names_precondition(reference.error, expected_id):
        return
    actual, step = record.actual, reference.failed_step
    if actual.not_rejected or actual.error is None:
        yield Violation(
            "INV-REJECT-INVALID",
            f"inputs violating {expected_id} were accepted on rank {record.rank}: "
            + (actual.not_rejected or f"the step completed instead of raising in step {step}"),
            rank=record.rank,
            field="errors",
        )
    elif actual.failed_step != step or len(actual.wire) > len(reference.wire):
        yield Violation(
            "INV-REJECT-INVALID",
            f"inputs violating {expected_id} raised in step {actual.failed_step} "
            f"after {len(actual.wire)} collectives, expected a raise in step {step} after "
            f"{len(reference.wire)}",
            rank=record.rank,
            field="errors",
        )
    elif not names_precondition(actual.error, expected_id):
        yield Violation(
            "INV-REJECT-INVALID",
            f"the error does not name {expected_id}: {type(actual.error).__name__}: {actual.error}",
            rank=record.rank,
            field="errors",
        )


@rank_check(
    "INV-REJECT-NAMES-PRECONDITION",
    applies=lambda record: (
        record.case.expect_error not in ALWAYS_REJECTED
        and _reference_rejects(record)
        and record.actual.error is not None
    ),
)
def check_reject_names_precondition(record: StepRecord) -> Iterable[Violation]:
    expected_id = record.case.expect_error
    error = record.actual.error
    if expected_id is None or error is None or expected_id in ALWAYS_REJECTED:
        return  # nothing raised, nothing to name; INV-REJECT-INVALID judges the must-reject ones whole
    # Judged on the ranks where the reference itself detects the violation; on
    # the others an error may just follow a peer leaving a collective.
    if not names_precondition(record.expected.error, expected_id) or names_precondition(error, expected_id):
        return
    yield Violation(
        "INV-REJECT-NAMES-PRECONDITION",
        f"the error does not name {expected_id}: {type(error).__name__}: {error}",
        rank=record.rank,
        field="errors",
    )
