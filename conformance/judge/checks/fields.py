"""Fields compared with the reference's, declared in tables: one table per invariant, one row per field.

A :class:`Field` says where a field of the step's outputs lies (its path, as violations name it), what
it is (a device tensor, a host array, a Python int, ...), how its entries map to batch positions, when
it may be None and under which rules it is the spec's. A :class:`FieldTable` lists an invariant's fields
in the order they are judged and compares each with the reference's (common.py's comparisons). A checker
whose invariant is about such fields is its table (:func:`field_check`); hand-written code stays only for
what a table cannot say (a value the reference does not hold, a layout in memory, the wire).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from typing import Any

import numpy as np

from shardspec.conformance.judge.checks.base import StepRecord, Violation, outputs_expected, rank_check
from shardspec.conformance.judge.checks.common import (
    RowToRequest,
    check_array,
    check_list,
    check_scalar,
    check_tensor,
    fmt,
    local_row_owner,
    lookup,
    plan_of,
)
from shardspec.conformance.record import StepOutputs
from shardspec.spec.rules import Rules

# What a field is: how it is compared.
TENSOR = "tensor"  # a device tensor: type, dtype, shape, device, values
LAYOUT = "layout"  # a device tensor whose values another invariant judges: type, dtype, shape, device
ARRAY = "array"  # a host numpy array of the field's dtype
INT, BOOL = "int", "bool"  # a Python int, a Python bool
INT_LIST, STR_LIST = "int_list", "str_list"  # a Python list of ints, of strs
PRESENCE = "presence"  # an object the fields below it lie in: only whether it is None (see none_when)

# Where a field's entries go: the record -> entry (row) index -> batch position, None where none.
Rows = Callable[[StepRecord], RowToRequest]

# The step's results that violations name from the outputs (``gathered.num_sampled``); the shard step's
# are named without "shard." (``local_batch.seq_lens``).
STEP_OUTPUTS = frozenset(f.name for f in dataclass_fields(StepOutputs))


@dataclass(frozen=True)
class Field:
    """One field compared with the reference's.

    ``none_when``: the field may be None, exactly when the reference's is; the words say when (they end
    the message). ``judged_as``: the value the field is judged against, from the record and the reference's
    (default: the reference's itself); such a field is judged also where the reference has none. ``note``:
    words that end a violation's message. ``when``: the rules under which the field is the spec's (default:
    every profile's)."""

    path: str
    kind: str
    rows: Rows | None = None
    dtype: Any = None
    none_when: str | None = None
    judged_as: Callable[[StepRecord, Any], Any] | None = None
    note: str | Callable[[StepRecord], str] = ""
    when: Callable[[Rules], bool] | None = None


def value_at(outputs: StepOutputs, path: str) -> tuple[Any, bool]:
    """The value at ``path`` in ``outputs`` and whether every object on the way holds one (a None on the way:
    the value is None and not there)."""
    names = path.split(".")
    value: Any = outputs if names[0] in STEP_OUTPUTS else outputs.shard
    for name in names:
        if value is None:
            return None, False
        value = getattr(value, name, None)
    return value, True


def compare_field(invariant_id: str, record: StepRecord, field: Field, got: Any, want: Any) -> Violation | None:
    """``got`` (the implementation's) against ``want`` (the reference's), as ``field`` says."""
    if field.judged_as is not None:
        want = field.judged_as(record, want)
    if field.none_when is not None and (got is None or want is None):
        if got is want:
            return None
        shown = [("set" if field.kind == PRESENCE and v is not None else fmt(v)) for v in (got, want)]
        message = f"{field.path} is {shown[0]}, expected {shown[1]} ({field.none_when})"
        return Violation(invariant_id, message, rank=record.rank, field=field.path)
    if field.kind == PRESENCE:
        return None
    violation = _compare_value(invariant_id, record, field, got, want)
    if violation is not None:
        violation.message += field.note(record) if callable(field.note) else field.note
    return violation


def _compare_value(invariant_id: str, record: StepRecord, field: Field, got: Any, want: Any) -> Violation | None:
    rows = field.rows(record) if field.rows is not None else no_request
    path, kind = field.path, field.kind
    if kind in (TENSOR, LAYOUT):
        return check_tensor(invariant_id, record, path, got, want, rows, values=kind == TENSOR)
    if kind == ARRAY:
        return check_array(invariant_id, record, path, got, want, field.dtype, rows)
    if kind in (INT_LIST, STR_LIST):
        return check_list(invariant_id, record, path, got, want, int if kind == INT_LIST else str, rows)
    return check_scalar(invariant_id, record, path, got, want, bool if kind == BOOL else int)


@dataclass(frozen=True)
class FieldTable:
    """An invariant's fields, in the order they are judged. ``each``: every field that differs is reported;
    otherwise the first only, as the later ones usually follow from it."""

    invariant_id: str
    fields: tuple[Field, ...]
    each: bool = False

    def judged(self, record: StepRecord) -> bool:
        """Both the implementation and the reference returned the step result the fields lie in."""
        head = self.fields[0].path.split(".")[0]
        result = head if head in STEP_OUTPUTS else "shard"
        present = getattr(record.actual, result) is not None and getattr(record.expected, result) is not None
        return outputs_expected(record) and present

    def violations(self, record: StepRecord) -> list[Violation]:
        """The fields that differ from the reference's; a field in an object the reference does not return
        (a None on its path) is not judged, unless the field says what it is judged against."""
        found: list[Violation] = []
        for field in self.fields:
            if field.when is not None and not field.when(record.rules):
                continue
            want, there = value_at(record.expected, field.path)
            if not there and field.judged_as is None:
                continue
            violation = compare_field(self.invariant_id, record, field, value_at(record.actual, field.path)[0], want)
            if violation is not None:
                found.append(violation)
                if not self.each:
                    break
        return found


# Every invariant's table, by ID: those checked by their table alone and those a checker's code uses.
FIELD_TABLES: dict[str, FieldTable] = {}


def field_table(invariant_id: str, *fields: Field, each: bool = False) -> FieldTable:
    if invariant_id in FIELD_TABLES:
        raise ValueError(f"two field tables for {invariant_id}")
    table = FIELD_TABLES[invariant_id] = FieldTable(invariant_id, fields, each)
    return table


def field_check(invariant_id: str, *fields: Field, each: bool = False) -> FieldTable:
    """The table of an invariant whose checker is its table alone, registered as that checker."""
    table = field_table(invariant_id, *fields, each=each)

    def check(record: StepRecord) -> list[Violation]:
        return table.violations(record) if table.judged(record) else []

    check.__name__ = check.__qualname__ = "check_" + invariant_id.lower().replace("-", "_")
    rank_check(invariant_id)(check)
    return table


# -- where entries go ---------------------------------------------------------


def no_request(row: int) -> None:
    """Entries that map to no one request (token space, scalars)."""
    return None


def by_batch_position(record: StepRecord) -> RowToRequest:
    """Entry i is batch position i (the gathered results, one row per request)."""
    return lambda row: row


def by_local_request(record: StepRecord) -> RowToRequest:
    """Local request j -> its batch position."""
    return lookup(plan_of(record).local_reqs)


def by_local_row(record: StepRecord) -> RowToRequest:
    """Local logits row -> the batch position of its request."""
    return lookup(local_row_owner(plan_of(record)))


def by_owner_sorted_row(record: StepRecord) -> RowToRequest:
    """Owner-sorted logits row k -> the batch position of its request (the k-th entry of the expansion)."""
    plan = plan_of(record)
    return lookup(np.repeat(plan.owner_sorted_reqs, plan.num_logits_per_req[plan.owner_sorted_reqs]))


def by_local_prefix_entry(record: StepRecord) -> RowToRequest:
    """Entry k of a local prefix sum [n+1] -> local request k-1 (entry 0 -> the first)."""
    local = plan_of(record).local_reqs
    return lambda k: int(local[max(k - 1, 0)]) if local.size and k <= local.size else None


def by_prefix_entry(record: StepRecord) -> RowToRequest:
    """Entry k of a batch prefix sum [N+1] -> request k-1 (entry 0 -> the first)."""
    return lambda k: max(k - 1, 0)
