"""Invalid inputs: rejected during the shard step, with an error naming the precondition.

Both checkers judge only cases with ``expect_error`` set.
"""

from __future__ import annotations

from typing import Iterable

from shardspec.conformance.checks.base import StepRecord, Violation, rank_check

# The preconditions that must always be rejected (never truncated or wrapped).
ALWAYS_REJECTED = ("PRE-CAPACITY-REQS", "PRE-CAPACITY-LOGITS", "PRE-SLOT-RANGE")


@rank_check("INV-REJECT-INVALID")
def check_reject_invalid(record: StepRecord) -> Iterable[Violation]:
    expected_id = record.case.expect_error
    if expected_id not in ALWAYS_REJECTED:
        return
    actual = record.actual
    if actual.error is None:
        written = "returned outputs" if actual.shard is not None else "returned"
        yield Violation("INV-REJECT-INVALID", f"inputs violating {expected_id} were accepted: the shard step "
                        f"{written} instead of raising", rank=record.rank, field="errors")
        return
    if actual.failed_step != "shard" or actual.shard is not None or actual.wire:
        yield Violation("INV-REJECT-INVALID", f"inputs violating {expected_id} raised in step {actual.failed_step} "
                        f"after {len(actual.wire)} collectives, expected a raise in the shard step before any "
                        "output", rank=record.rank, field="errors")


@rank_check("INV-REJECT-NAMES-PRECONDITION")
def check_reject_names_precondition(record: StepRecord) -> Iterable[Violation]:
    expected_id = record.case.expect_error
    error = record.actual.error
    if expected_id is None or error is None:
        return  # nothing raised, nothing to name (INV-REJECT-INVALID judges the must-reject ones)
    # Judged on the ranks where the reference itself detects the violation; on
    # the others an error may just follow a peer leaving a collective.
    if not names(record.expected.error, expected_id) or names(error, expected_id):
        return
    yield Violation("INV-REJECT-NAMES-PRECONDITION", f"the error does not name {expected_id}: "
                    f"{type(error).__name__}: {error}", rank=record.rank, field="errors")


def names(error, precondition_id: str) -> bool:
    return error is not None and (getattr(error, "precondition_id", None) == precondition_id
                                  or precondition_id in str(error))
