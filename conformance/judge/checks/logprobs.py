"""Gathered logprobs: agreed widths, copied or padded values, rows of ranks that supplied none."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from shardspec.conformance.judge.checks.base import StepRecord, Violation, rank_check
from shardspec.conformance.judge.checks.common import (
    first_differing_row,
    global_row_owner,
    lookup,
    plan_of,
    row_violation,
)
from shardspec.conformance.judge.checks.fields import LAYOUT, PRESENCE, Field, field_check
from shardspec.conformance.judge.checks.gather import gathered_pair
from shardspec.spec.case import Case

FIELDS = ("logprob_token_ids", "logprobs", "selected_token_ranks")
PREFIX = "gathered.logprobs_tensors"


def ranks_without_logprobs(case: Case) -> set[int]:
    """Ranks whose local sampler output has no logprobs_tensors (the toy sampler always has them)."""
    if case.local_outputs == "toy":
        return set()
    return {
        rank
        for rank in range(case.tp_size)
        if case.local_outputs.get(rank) is None or case.local_outputs[rank].logprob_token_ids is None
    }


# The gathered logprobs' layout; their values are INV-LOGPROBS-VALUES' and INV-LOGPROBS-MISSING's.
SHAPES = field_check(
    "INV-LOGPROBS-SHAPES",
    Field(PREFIX, PRESENCE, none_when="None exactly when the case's logprobs_dims is None"),
    *[Field(f"{PREFIX}.{name}", LAYOUT) for name in FIELDS],
)


def logprob_pair(record: StepRecord):
    """(actual, expected) LogprobsTensors when both exist with the expected layout, else None."""
    pair = gathered_pair(record)
    if pair is None or record.case.logprobs_dims is None:
        return None
    actual, expected = pair[0].logprobs_tensors, pair[1].logprobs_tensors
    if actual is None or expected is None or SHAPES.violations(record):
        return None  # INV-LOGPROBS-SHAPES reports it
    return actual, expected


def rows_owned_by(record: StepRecord, ranks: set[int]) -> np.ndarray:
    """Logits rows (batch order) of requests whose owner is in ``ranks``."""
    plan = plan_of(record)
    row_owner = global_row_owner(plan)
    return np.flatnonzero(np.isin(plan.owners[row_owner], list(ranks)))


def _first_mismatch(record: StepRecord, invariant_id: str, actual, expected, rows: np.ndarray) -> Violation | None:
    by_row = lookup(global_row_owner(plan_of(record)))
    for name in FIELDS:
        got, want = getattr(actual, name), getattr(expected, name)
        row = first_differing_row(got, want, rows)
        if row is not None:
            return row_violation(invariant_id, record, f"{PREFIX}.{name}", row, got, want, by_row(row))
    return None


@rank_check("INV-LOGPROBS-VALUES")
def check_logprobs_values(record: StepRecord) -> Iterable[Violation]:
    pair = logprob_pair(record)
    if pair is None:
        return
    missing = ranks_without_logprobs(record.case)
    supplied = set(range(record.case.tp_size)) - missing
    violation = _first_mismatch(record, "INV-LOGPROBS-VALUES", *pair, rows_owned_by(record, supplied))
    if violation:
        yield violation


@rank_check("INV-LOGPROBS-MISSING")
def check_logprobs_missing(record: StepRecord) -> Iterable[Violation]:
    pair = logprob_pair(record)
    missing = ranks_without_logprobs(record.case)
    if pair is None or not missing:
        return
    actual = pair[0]
    cols = actual.logprobs.shape[1]
    rows = rows_owned_by(record, missing)
    # What the spec prescribes for those rows, independent of the reference.
    padded = type(actual)(
        torch.zeros_like(actual.logprob_token_ids),
        torch.full(
            (actual.logprobs.shape[0], cols), float("-inf"), dtype=actual.logprobs.dtype, device=actual.logprobs.device
        ),
        torch.zeros_like(actual.selected_token_ranks),
        None,
    )
    violation = _first_mismatch(record, "INV-LOGPROBS-MISSING", actual, padded, rows)
    if violation:
        yield violation
