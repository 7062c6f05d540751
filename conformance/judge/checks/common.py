"""Comparisons shared by the checkers, and the spec's plan they read.

Every comparison returns the first :class:`Violation` it finds (or None), so a
checker reports one problem per field, naming the batch position of the
first offending request.

When to judge (:func:`base.outputs_expected`): checkers of invariants about
outputs judge only cases without ``expect_error`` whose reference run
succeeded. If the implementation raised unexpectedly, each checker skips the
outputs it lacks; the exception itself is reported once (base.STEP_REPORTER).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from shardspec.conformance.judge.checks.base import StepRecord, Violation, outputs_expected
from shardspec.reference.plan import ShardPlan, build_plan
from shardspec.reference.profile_rules import device_cu_num_logits
from shardspec.spec.rule_meanings import reqs_per_rank_choices

RowToRequest = Callable[[int], int | None]


def shards(record: StepRecord):
    """(actual, expected) ShardResults when both exist and the case is judged, else None."""
    if not outputs_expected(record) or record.actual.shard is None or record.expected.shard is None:
        return None
    return record.actual.shard, record.expected.shard


def plan_of(record: StepRecord) -> ShardPlan:
    """The spec's plan for this record's batch and rank (a pure function of the batch and, under owner rule
    owner_table, the step's owner table)."""
    batch = record.inputs.batch
    rules = record.rules
    cu = device_cu_num_logits(batch, rules)  # the admitted rows where drafts are admitted (CL-ADMITTED-DRAFTS)
    table = record.inputs.shard_kwargs.get("owner_table")
    return build_plan(batch.idx_mapping_np, cu, record.case.tp_size, record.rank, rules.owner, table)


def empty_batch_padding(record: StepRecord) -> tuple[int, ...]:
    """The max_num_reqs_per_rank values the profile allows for the record's batch: the plan's, or for an
    empty batch under empty_batch_padding zero_or_one (0, 1) (CL-EMPTY-BATCH)."""
    padding = record.rules.empty_batch_padding
    return reqs_per_rank_choices(padding, plan_of(record).num_reqs_per_rank.tolist())


def chosen_padding(record: StepRecord) -> int:
    """The max_num_reqs_per_rank the metadata and the wire are judged in: the implementation's choice where
    the profile leaves one (an empty batch under zero_or_one, CL-EMPTY-BATCH), else the reference's."""
    expected = record.expected.shard.metadata.max_num_reqs_per_rank
    actual = record.actual.shard.metadata if record.actual.shard is not None else None
    chosen = getattr(actual, "max_num_reqs_per_rank", None)
    return chosen if type(chosen) is int and chosen in empty_batch_padding(record) else expected


def wire_metadata(record: StepRecord):
    """The expected metadata in the padding the implementation chose where the profile leaves the choice
    (:func:`chosen_padding`): the wire is judged in the rows it chose."""
    return replace(record.expected.shard.metadata, max_num_reqs_per_rank=chosen_padding(record))


def local_row_owner(plan: ShardPlan) -> np.ndarray:
    """[L_local] batch position of each local logits row."""
    local = plan.local_reqs
    return np.repeat(local, plan.num_logits_per_req[local])


def global_row_owner(plan: ShardPlan) -> np.ndarray:
    """[L] batch position of each logits row of the batch."""
    return np.repeat(np.arange(plan.owners.shape[0]), plan.num_logits_per_req)


def lookup(positions: np.ndarray) -> RowToRequest:
    """Row index -> batch position, None outside ``positions``."""
    return lambda row: int(positions[row]) if 0 <= row < positions.shape[0] else None


def fmt(value: Any, limit: int = 12) -> str:
    """A short readable rendering of a tensor, array or list."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().tolist()
    elif isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, list) and len(value) > limit:
        return "[" + ", ".join(repr(v) for v in value[:limit]) + f", ... ({len(value)} entries)]"
    return repr(value)


def values_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-element equality where NaN equals NaN."""
    equal = a == b
    if a.is_floating_point() or b.is_floating_point():
        equal = equal | (a.isnan() & b.isnan())
    return equal


def first_bad_row(equal: torch.Tensor) -> int | None:
    """Index along dim 0 of the first row holding a False, or None."""
    rows = equal.reshape(1) if equal.dim() == 0 else equal.flatten(1).all(dim=1) if equal.dim() > 1 else equal
    bad = torch.nonzero(~rows).flatten()
    return int(bad[0]) if bad.numel() else None


def field_violation(
    invariant_id: str, record: StepRecord, field: str, message: str, request: int | None = None
) -> Violation:
    """A violation of ``field`` on the record's rank, its message led by the field's name."""
    return Violation(invariant_id, f"{field}: {message}", rank=record.rank, request=request, field=field)


def check_tensor(
    invariant_id: str,
    record: StepRecord,
    field: str,
    actual: Any,
    expected: torch.Tensor,
    row_to_request: RowToRequest = lambda row: None,
    *,
    values: bool = True,
) -> Violation | None:
    """Type, dtype, shape, device and (unless ``values`` is False) values of a device tensor."""
    if not isinstance(actual, torch.Tensor):
        message = f"expected a torch.Tensor, got {type(actual).__name__}: {fmt(actual)}"
    elif actual.dtype != expected.dtype:
        message = f"dtype {actual.dtype}, expected {expected.dtype}"
    elif tuple(actual.shape) != tuple(expected.shape):
        message = f"shape {list(actual.shape)}, expected {list(expected.shape)}"
    elif actual.device != expected.device:
        message = f"on device {actual.device}, expected {expected.device}"
    else:
        equal = values_equal(actual, expected.to(actual.device)) if values else None
        row = None if equal is None else first_bad_row(equal)
        if row is None:
            return None
        return field_violation(invariant_id, record, field, diff_summary(actual, expected, equal), row_to_request(row))
    return field_violation(invariant_id, record, field, message)


def first_differing_row(actual: torch.Tensor, expected: torch.Tensor, rows: np.ndarray) -> int | None:
    """The first of ``rows`` (indices along dim 0) where ``actual`` and ``expected`` differ, or None."""
    index = torch.from_numpy(rows).to(actual.device)
    bad = first_bad_row(values_equal(actual[index], expected.to(actual.device)[index]))
    return None if bad is None else int(rows[bad])


def row_violation(
    invariant_id: str, record: StepRecord, field: str, row: int, actual: Any, expected: Any, request: int | None
) -> Violation:
    """Row ``row`` of ``field`` differs: both rows shown, not whole tensors."""
    message = f"{field} row {row} is {fmt(actual[row])}, expected {fmt(expected[row])}"
    return Violation(invariant_id, message, rank=record.rank, request=request, field=field)


def diff_summary(actual: torch.Tensor, expected: torch.Tensor, equal: torch.Tensor, shown: int = 3) -> str:
    """The first few differing rows, actual against expected, and how many differ: not whole tensors."""
    if actual.dim() == 0:
        return f"{fmt(actual)}, expected {fmt(expected)}"
    rows_equal = equal.flatten(1).all(dim=1) if equal.dim() > 1 else equal
    bad = torch.nonzero(~rows_equal).flatten().tolist()
    parts = [f"row {r} is {fmt(actual[r])}, expected {fmt(expected[r])}" for r in bad[:shown]]
    return "; ".join(parts) + f" ({len(bad)} of {actual.shape[0]} rows differ)"


def check_array(
    invariant_id: str,
    record: StepRecord,
    field: str,
    actual: Any,
    expected: np.ndarray,
    dtype: Any,
    row_to_request: RowToRequest = lambda row: None,
) -> Violation | None:
    """A host numpy array: type, dtype, shape and values."""
    request = None
    if not isinstance(actual, np.ndarray):
        message = f"expected a host numpy array, got {type(actual).__name__}: {fmt(actual)}"
    elif actual.dtype != np.dtype(dtype):
        message = f"dtype {actual.dtype}, expected {np.dtype(dtype)}"
    elif actual.shape != expected.shape:
        message = f"shape {list(actual.shape)}, expected {list(expected.shape)}"
    else:
        bad = np.flatnonzero(actual != expected)
        if not bad.size:
            return None
        shown = "; ".join(f"entry {int(i)} is {actual[i]!r}, expected {expected[i]!r}" for i in bad[:3])
        message, request = f"{shown} ({bad.size} of {actual.size} entries differ)", row_to_request(int(bad[0]))
    return field_violation(invariant_id, record, field, message, request)


def check_scalar(
    invariant_id: str, record: StepRecord, field: str, actual: Any, expected: Any, kind: type = int
) -> Violation | None:
    """A Python int (or the ``kind`` given: bool); bool, numpy and tensor scalars are not ints here."""
    if type(actual) is not kind:
        message = f"expected a Python {kind.__name__} {expected}, got {type(actual).__name__} {fmt(actual)}"
    elif actual != expected:
        message = f"{actual}, expected {expected}"
    else:
        return None
    return field_violation(invariant_id, record, field, message)


def check_list(
    invariant_id: str,
    record: StepRecord,
    field: str,
    actual: Any,
    expected: Sequence[Any],
    kind: type,
    row_to_request: RowToRequest = lambda row: None,
) -> Violation | None:
    """A Python list of ``kind`` entries (int or str; the data model's list: a tuple or an array is not one)."""
    expected, entries = list(expected), f"Python {kind.__name__}"
    if type(actual) is not list:
        message = f"expected a list of {entries}s {fmt(expected)}, got {type(actual).__name__} {fmt(actual)}"
        return field_violation(invariant_id, record, field, message)
    wrong = next((i for i, v in enumerate(actual) if type(v) is not kind), None)
    if wrong is not None:
        message = f"entry {wrong} is a {type(actual[wrong]).__name__}, not a {entries}"
        return field_violation(invariant_id, record, field, message, row_to_request(wrong))
    if actual == expected:
        return None
    pairs = enumerate(zip(actual, expected, strict=False))
    bad = next((i for i, (got, want) in pairs if got != want), min(len(actual), len(expected)))
    if len(actual) != len(expected):
        message = f"{len(actual)} entries {fmt(actual)}, expected {len(expected)}: {fmt(expected)}"
    else:
        message = (
            f"entry {bad} is {actual[bad]!r}, expected {expected[bad]!r}; "
            f"whole list {fmt(actual)}, expected {fmt(expected)}"
        )
    return field_violation(invariant_id, record, field, message, row_to_request(bad))


def found(*violations: Violation | None) -> list[Violation]:
    """The violations that were found, in order (for checkers that judge several fields)."""
    return [v for v in violations if v is not None]
