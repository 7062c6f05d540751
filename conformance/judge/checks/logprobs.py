"""Gathered logprobs: agreed widths, copied or padded values, rows of ranks that supplied none."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from shardspec.conformance.judge.checks.base import StepRecord, Violation, rank_check
from shardspec.conformance.judge.checks.common import (
    check_tensor,
    first_bad_row,
    fmt,
    global_row_owner,
    lookup,
    plan_of,
    values_equal,
)
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


def logprob_pair(record: StepRecord):
    """(actual, expected) LogprobsTensors when both exist with the expected layout, else None."""
    pair = gathered_pair(record)
    if pair is None or record.case.logprobs_dims is None:
        return None
    actual, expected = pair[0].logprobs_tensors, pair[1].logprobs_tensors
    if actual is None or expected is None:
        return None
    for name in FIELDS:
        if check_tensor("", record, name, getattr(actual, name), getattr(expected, name), values=False):
            return None  # INV-LOGPROBS-SHAPES reports it
    return actual, expected


def rows_owned_by(record: StepRecord, ranks: set[int]) -> np.ndarray:
    """Logits rows (batch order) of requests whose owner is in ``ranks``."""
    plan = plan_of(record)
    row_owner = global_row_owner(plan)
    return np.flatnonzero(np.isin(plan.owners[row_owner], list(ranks)))


@rank_check("INV-LOGPROBS-SHAPES")
def check_logprobs_shapes(record: StepRecord) -> Iterable[Violation]:
    pair = gathered_pair(record)
    if pair is None:
        return
    actual, expected = pair[0].logprobs_tensors, pair[1].logprobs_tensors
    if expected is None or actual is None:
        if (actual is None) != (expected is None):
            dims = record.case.logprobs_dims
            yield Violation(
                "INV-LOGPROBS-SHAPES",
                f"{PREFIX} is {'None' if actual is None else 'set'} with logprobs_dims={dims}",
                rank=record.rank,
                field=PREFIX,
            )
        return
    for name in FIELDS:
        violation = check_tensor(
            "INV-LOGPROBS-SHAPES",
            record,
            f"{PREFIX}.{name}",
            getattr(actual, name),
            getattr(expected, name),
            values=False,
        )
        if violation:
            yield violation
            return


def _first_mismatch(record: StepRecord, invariant_id: str, actual, expected, rows: np.ndarray) -> Violation | None:
    by_row = lookup(global_row_owner(plan_of(record)))
    index = torch.from_numpy(rows)
    for name in FIELDS:
        got, want = getattr(actual, name), getattr(expected, name)
        equal = values_equal(got[index.to(got.device)], want[index.to(want.device)].to(got.device))
        bad = first_bad_row(equal)
        if bad is not None:
            row = int(rows[bad])
            return Violation(
                invariant_id,
                f"{PREFIX}.{name} row {row} is {fmt(got[row])}, expected {fmt(want[row])}",
                rank=record.rank,
                request=by_row(row),
                field=f"{PREFIX}.{name}",
            )
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
