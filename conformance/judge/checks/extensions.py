"""Extension fields come back in place, on every rank, never dropped (INV-GATHER-EXTENSIONS).

The case declares the fields; every rank's sampler output carries values that
are a function of each entry's (slot, row position) only
(:func:`shardspec.spec.case_edits.extension_rows`), so the gathered rows are
judged against values recomputed from the batch, independently of the
reference's run. The wire is judged on the rows that carry data.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from shardspec.conformance.judge.checks.base import StepRecord, Violation, rank_check
from shardspec.conformance.judge.checks.common import (
    declined_extensions,
    first_bad_row,
    fmt,
    judgeable,
    plan_of,
    values_equal,
)
from shardspec.reference.profile_rules import device_cu_num_logits
from shardspec.spec.case_edits import batch_extension_values, declared_fields

INVARIANT = "INV-GATHER-EXTENSIONS"
ALL_GATHER = "all_gather_into_tensor"


def _violation(record: StepRecord, message: str, field: str, request: int | None = None) -> Violation:
    return Violation(INVARIANT, message, rank=record.rank, request=request, field=field)


def _declined(record: StepRecord) -> bool:
    """The implementation rejected the declared fields as unsupported, in the gather, before its collectives."""
    actual = record.actual
    # Only the all_to_all precedes the gather's collectives.
    return declined_extensions(record.case, actual) and actual.failed_step == "gather" and len(actual.wire) <= 1


def _declared(case) -> dict | None:
    """The extension_fields the case passes ({} for an empty declaration, None for none)."""
    return declared_fields(case.extensions, case.edits)


@rank_check(INVARIANT, applies=lambda record: _declared(record.case) is not None and record.case.expect_error is None)
def check_gather_extensions(record: StepRecord) -> Iterable[Violation]:
    fields = _declared(record.case)
    if (
        fields is None
        or not judgeable(record)
        or record.actual.failed_step in ("construct", "shard", "all_to_all", "sample")
    ):
        return
    if record.actual.error is not None:
        if not _declined(record):
            error = record.actual.error
            yield _violation(
                record,
                f"the gather raised {type(error).__name__}: {error}; with extension fields "
                "it must gather them or reject them with PRE-EXTENSION-SUPPORTED",
                "gathered.extensions",
            )
        return
    gathered = record.actual.gathered.extensions
    if not isinstance(gathered, dict) or set(gathered) != set(fields):
        have = sorted(gathered) if isinstance(gathered, dict) else gathered
        yield _violation(
            record,
            f"gathered.extensions is {have}, expected the declared fields {sorted(fields)} "
            "(a dropped field reads as null to the engine)",
            "gathered.extensions",
        )
        return
    batch = record.inputs.batch
    device = record.expected.gathered.sampled_token_ids.device
    # A per-row field has the rows the device fields lay out: the admitted ones in vllm-0.33, where the
    # global cu_num_logits_np keeps the scheduled counts (CL-ADMITTED-DRAFTS).
    rows = device_cu_num_logits(batch, record.case.rules)
    for name, spec in fields.items():
        expected = batch_extension_values(name, spec, batch, device, rows)
        violation = _compare_field(record, name, gathered[name], expected, spec.per)
        if violation:
            yield violation
            return
    yield from _check_wire(record, fields)


def _compare_field(record: StepRecord, name: str, actual, expected: torch.Tensor, per: str) -> Violation | None:
    field = f"gathered.extensions.{name}"
    if not isinstance(actual, torch.Tensor):
        return _violation(record, f"is {type(actual).__name__}, expected a tensor", field)
    if actual.dtype != expected.dtype or tuple(actual.shape) != tuple(expected.shape):
        return _violation(
            record, f"is {actual.dtype} {list(actual.shape)}, expected {expected.dtype} {list(expected.shape)}", field
        )
    if actual.device != expected.device:
        return _violation(record, f"is on {actual.device}, expected the sharder's device {expected.device}", field)
    bad = first_bad_row(values_equal(actual, expected))
    if bad is None:
        return None
    request = bad if per == "request" else int(_row_owner(record)[bad])
    return _violation(
        record,
        f"row {bad} is {fmt(actual[bad])}, expected {fmt(expected[bad])} (another request's entry or none)",
        field,
        request=request,
    )


def _row_owner(record: StepRecord) -> np.ndarray:
    counts = np.diff(np.asarray(record.inputs.batch.cu_num_logits_np, dtype=np.int64))
    return np.repeat(np.arange(counts.shape[0]), counts)


def _check_wire(record: StepRecord, fields: dict) -> Iterable[Violation]:
    """Each field's all_gather, after the named ones: dtype, shape and the rows that carry local entries."""
    gathers = [call for call in record.actual.wire if call.kind == ALL_GATHER]
    first = len(gathers) - len(fields)
    reference = record.expected.shard
    local_out = record.actual.local_output
    if first < 1 or reference is None:
        yield _violation(
            record,
            f"{len(gathers)} all_gathers cannot hold {len(fields)} extension fields after the sampled outputs",
            "wire.all_gather_extensions",
        )
        return
    metadata, local_batch = reference.metadata, reference.local_batch
    width, rows_per = metadata.max_num_logits_per_req, metadata.max_num_reqs_per_rank
    counts = np.diff(np.asarray(local_batch.cu_num_logits_np, dtype=np.int64))
    row_rows = np.concatenate([j * width + np.arange(c) for j, c in enumerate(counts)] or [np.zeros(0, np.int64)])
    local_reqs = plan_of(record).local_reqs
    for offset, (name, spec) in enumerate(fields.items()):
        send = gathers[first + offset].send
        per_request = spec.per == "request"
        shape = (rows_per * (1 if per_request else width), *spec.shape)
        field = f"wire.all_gather_extensions.{name}"
        if send.dtype != spec.dtype or tuple(send.shape) != shape:
            yield _violation(
                record, f"sends {send.dtype} {list(send.shape)}, expected {spec.dtype} {list(shape)}", field
            )
            return
        local = None if local_out is None or local_out.extensions is None else local_out.extensions.get(name)
        rows = np.arange(metadata.num_local_reqs) if per_request else row_rows.astype(np.int64)
        # A local output that does not fit the spec's local batch follows a shard-step violation,
        # which is reported there; the wire is not judged then.
        if local is None or local.shape[0] == 0 or local.shape[0] != rows.shape[0]:
            continue
        index = torch.from_numpy(rows).to(send.device)
        bad = first_bad_row(values_equal(send[index], local.to(send.device)))
        if bad is not None:
            request = int(local_reqs[bad if per_request else int(rows[bad]) // width])
            yield _violation(
                record,
                f"wire row {int(rows[bad])} is {fmt(send[int(rows[bad])])}, expected the local entry {fmt(local[bad])}",
                field,
                request=request,
            )
            return
