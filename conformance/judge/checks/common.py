"""Comparisons shared by the checkers, and when a checker has something to judge.

Every comparison returns the first :class:`Violation` it finds (or None), so a
checker reports one problem per field, naming the batch position of the
first offending request.

When to judge (:func:`judgeable`): checkers of invariants about outputs judge
only cases without ``expect_error`` whose reference run succeeded. If the
implementation raised unexpectedly, each checker skips the outputs it lacks;
the exception itself is reported exactly once, by the checker of the first
invariant of the step that raised (:data:`STEP_REPORTER`), so a suite that
runs the checkers directly never passes a crashing implementation silently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from shardspec.conformance.judge.checks.base import StepRecord, Violation
from shardspec.reference.plan import ShardPlan, build_plan
from shardspec.reference.profile_rules import device_cu_num_logits
from shardspec.spec.errors import declines_extensions
from shardspec.spec.profiles import rules_of
from shardspec.spec.rule_meanings import reqs_per_rank_choices

# The invariant whose checker reports an unexpected exception of each step:
# the first invariant of that step in spec/invariants.yaml. "construct" is
# building the sharder; "sample" is the local sampler reading the
# implementation's local batch and full-vocab rows, so an error there
# belongs to the exchange that produced those rows.
STEP_REPORTER = {
    "construct": "INV-OWNER",
    "shard": "INV-OWNER",
    "all_to_all": "INV-A2A-SPLITS",
    "sample": "INV-A2A-LAYOUT",
    "gather": "INV-WIRE-SAMPLED",
}

RowToRequest = Callable[[int], int | None]


def judgeable(record: StepRecord) -> bool:
    """A valid case whose reference run completed."""
    return record.case.expect_error is None and record.expected.error is None


def shards(record: StepRecord):
    """(actual, expected) ShardResults when both exist and the case is judged, else None."""
    if not judgeable(record) or record.actual.shard is None or record.expected.shard is None:
        return None
    return record.actual.shard, record.expected.shard


def declined_extensions(case, outputs) -> bool:
    """The implementation refused the case's extension fields (spec/errors.py, declines_extensions)."""
    return declines_extensions(case.extensions, outputs.error)


def unexpected_error(record: StepRecord, invariant_id: str) -> list[Violation]:
    """The implementation's own exception, reported under ``invariant_id`` only."""
    actual = record.actual
    if not judgeable(record) or actual.error is None or declined_extensions(record.case, actual):
        return []
    # A step this table does not name is reported with the shard step's.
    if STEP_REPORTER.get(actual.failed_step, STEP_REPORTER["shard"]) != invariant_id:
        return []
    message = f"raised {type(actual.error).__name__} in step {actual.failed_step}: {actual.error}"
    return [Violation(invariant_id, message, rank=record.rank)]


def plan_of(record: StepRecord) -> ShardPlan:
    """The spec's plan for this record's batch and rank (a pure function of the batch and, under owner rule
    owner_table, the step's owner table)."""
    batch = record.inputs.batch
    rules = rules_of(record.case.profile)
    cu = device_cu_num_logits(batch, rules)  # the admitted rows where drafts are admitted (CL-ADMITTED-DRAFTS)
    table = record.inputs.shard_kwargs.get("owner_table")
    return build_plan(batch.idx_mapping_np, cu, record.case.tp_size, record.rank, rules.owner, table)


def empty_batch_padding(record: StepRecord) -> tuple[int, ...]:
    """The max_num_reqs_per_rank values the profile allows for the record's batch: the plan's, or for an
    empty batch under empty_batch_padding zero_or_one (0, 1) (CL-EMPTY-BATCH)."""
    padding = rules_of(record.case.profile).empty_batch_padding
    return reqs_per_rank_choices(padding, plan_of(record).num_reqs_per_rank.tolist())


def wire_metadata(record: StepRecord):
    """The expected metadata, with the empty batch's padding the implementation chose where the profile
    leaves the choice (CL-EMPTY-BATCH): the wire is judged in the rows it chose."""
    expected = record.expected.shard.metadata
    actual = record.actual.shard.metadata if record.actual.shard is not None else None
    chosen = getattr(actual, "max_num_reqs_per_rank", None)
    if chosen in empty_batch_padding(record) and chosen != expected.max_num_reqs_per_rank:
        from dataclasses import replace

        return replace(expected, max_num_reqs_per_rank=chosen)
    return expected


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

    def violation(message: str, request: int | None = None) -> Violation:
        return Violation(invariant_id, f"{field}: {message}", rank=record.rank, request=request, field=field)

    if not isinstance(actual, torch.Tensor):
        return violation(f"expected a torch.Tensor, got {type(actual).__name__}: {fmt(actual)}")
    if actual.dtype != expected.dtype:
        return violation(f"dtype {actual.dtype}, expected {expected.dtype}")
    if tuple(actual.shape) != tuple(expected.shape):
        return violation(f"shape {list(actual.shape)}, expected {list(expected.shape)}")
    if actual.device != expected.device:
        return violation(f"on device {actual.device}, expected {expected.device}")
    if not values:
        return None
    equal = values_equal(actual, expected.to(actual.device))
    row = first_bad_row(equal)
    if row is None:
        return None
    return violation(diff_summary(actual, expected, equal), row_to_request(row))


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

    def violation(message: str, request: int | None = None) -> Violation:
        return Violation(invariant_id, f"{field}: {message}", rank=record.rank, request=request, field=field)

    if not isinstance(actual, np.ndarray):
        return violation(f"expected a host numpy array, got {type(actual).__name__}: {fmt(actual)}")
    if actual.dtype != np.dtype(dtype):
        return violation(f"dtype {actual.dtype}, expected {np.dtype(dtype)}")
    if actual.shape != expected.shape:
        return violation(f"shape {list(actual.shape)}, expected {list(expected.shape)}")
    bad = np.flatnonzero(actual != expected)
    if not bad.size:
        return None
    shown = "; ".join(f"entry {int(i)} is {actual[i]!r}, expected {expected[i]!r}" for i in bad[:3])
    return violation(f"{shown} ({bad.size} of {actual.size} entries differ)", row_to_request(int(bad[0])))


def check_int(
    invariant_id: str, record: StepRecord, field: str, actual: Any, expected: int, request: int | None = None
) -> Violation | None:
    """A Python int (bool, numpy and tensor scalars are not ints here)."""
    if type(actual) is not int:
        message = f"{field}: expected a Python int {expected}, got {type(actual).__name__} {fmt(actual)}"
    elif actual != expected:
        message = f"{field}: {actual}, expected {expected}"
    else:
        return None
    return Violation(invariant_id, message, rank=record.rank, request=request, field=field)


def check_int_list(
    invariant_id: str,
    record: StepRecord,
    field: str,
    actual: Any,
    expected: Sequence[int],
    row_to_request: RowToRequest = lambda row: None,
) -> Violation | None:
    """A list of Python ints."""

    def violation(message: str, request: int | None = None) -> Violation:
        return Violation(invariant_id, f"{field}: {message}", rank=record.rank, request=request, field=field)

    if type(actual) is not list:
        return violation(f"expected a list of Python ints {list(expected)}, got {type(actual).__name__} {fmt(actual)}")
    wrong = [i for i, v in enumerate(actual) if type(v) is not int]
    if wrong:
        return violation(f"entry {wrong[0]} is a {type(actual[wrong[0]]).__name__}, not a Python int")
    if len(actual) != len(expected):
        return violation(f"{len(actual)} entries {fmt(actual)}, expected {len(expected)}: {fmt(list(expected))}")
    for i, (got, want) in enumerate(zip(actual, expected, strict=True)):
        if got != want:
            return violation(
                f"entry {i} is {got}, expected {want}; whole list {fmt(actual)}, expected {fmt(list(expected))}",
                row_to_request(i),
            )
    return None


def check_str_list(
    invariant_id: str,
    record: StepRecord,
    field: str,
    actual: Any,
    expected: Sequence[str],
    row_to_request: RowToRequest = lambda row: None,
) -> Violation | None:
    """A Python list of str (the data model's list[str]: a tuple or an array is not one)."""

    def violation(message: str, request: int | None = None) -> Violation:
        return Violation(invariant_id, f"{field}: {message}", rank=record.rank, request=request, field=field)

    if type(actual) is not list:
        return violation(f"expected a list of str {fmt(list(expected))}, got {type(actual).__name__} {fmt(actual)}")
    wrong = [i for i, v in enumerate(actual) if type(v) is not str]
    if wrong:
        return violation(
            f"entry {wrong[0]} is a {type(actual[wrong[0]]).__name__}, not a str", row_to_request(wrong[0])
        )
    if actual != list(expected):
        pairs = enumerate(zip(actual, expected, strict=False))
        bad = next((i for i, (a, b) in pairs if a != b), min(len(actual), len(expected)))
        return violation(f"is {fmt(actual)}, expected {fmt(list(expected))}", row_to_request(bad))
    return None


def found(*violations: Violation | None) -> list[Violation]:
    """The violations that were found, in order (for checkers that judge several fields)."""
    return [v for v in violations if v is not None]
