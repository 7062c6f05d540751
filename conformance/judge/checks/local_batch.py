"""The local batch: every localized field on host and device, and the global ones."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shardspec.conformance.judge.checks.base import StepRecord, Violation, rank_check
from shardspec.conformance.judge.checks.common import (
    check_array,
    check_int,
    check_str_list,
    check_tensor,
    fmt,
    found,
    local_row_owner,
    lookup,
    plan_of,
    shards,
)


def _local_batches(record: StepRecord):
    pair = shards(record)
    return None if pair is None else (pair[0].local_batch, pair[1].local_batch)


def _by_local_request(record: StepRecord):
    """Local request j -> its batch position."""
    return lookup(plan_of(record).local_reqs)


def _by_local_row(record: StepRecord):
    """Local logits row -> the batch position of its request."""
    return lookup(local_row_owner(plan_of(record)))


def _by_prefix_entry(record: StepRecord):
    """Entry k of a prefix sum [n+1] -> local request k-1 (entry 0 -> the first)."""
    local = plan_of(record).local_reqs
    return lambda k: int(local[max(k - 1, 0)]) if local.size and k <= local.size else None


@dataclass(frozen=True)
class LocalField:
    """One field of the local batch compared with the reference's: how its entries map to requests, and for
    host arrays the dtype. ``optional``: None exactly when the reference's is None (the batch's is)."""

    name: str
    kind: str  # "tensor" | "array" | "int" | "str_list"
    rows: Callable[[StepRecord], Callable[[int], int | None]] | None = None
    dtype: Any = None
    optional: bool = False


# Each invariant's fields, in the order they are judged; one ID, written once.
LOCAL_FIELDS: dict[str, tuple[LocalField, ...]] = {
    "INV-LOCAL-REQS": (LocalField("req_ids", "str_list", _by_local_request), LocalField("num_reqs", "int")),
    "INV-LOCAL-IDX-MAPPING": (
        LocalField("idx_mapping", "tensor", _by_local_request),
        LocalField("idx_mapping_np", "array", _by_local_request, np.intp),
    ),
    "INV-LOCAL-CU-NUM-LOGITS": (
        LocalField("cu_num_logits", "tensor", _by_prefix_entry),
        LocalField("cu_num_logits_np", "array", _by_prefix_entry, np.int32),
    ),
    "INV-LOCAL-LOGITS-INDICES": (LocalField("logits_indices", "tensor", _by_local_row),),
    "INV-LOCAL-EXPANDED": (
        LocalField("expanded_idx_mapping", "tensor", _by_local_row),
        LocalField("expanded_local_pos", "tensor", _by_local_row),
    ),
    "INV-LOCAL-SEQ-LENS": (LocalField("seq_lens", "tensor", _by_local_request),),
    # vllm-0.33: the owned requests' host bounds, a CPU tensor.
    "INV-LOCAL-SEQ-LENS-UPPER-BOUND": (
        LocalField("seq_lens_cpu_upper_bound", "tensor", _by_local_request, optional=True),
    ),
    "INV-LOCAL-DRAFTS": (
        LocalField("num_draft_tokens_per_req", "array", _by_local_request, np.int32, optional=True),
        LocalField("num_draft_tokens", "int"),
    ),
}


def _compare(invariant_id: str, record: StepRecord, spec: LocalField, actual, expected) -> Violation | None:
    field = f"local_batch.{spec.name}"
    got, want = getattr(actual, spec.name, None), getattr(expected, spec.name)
    if spec.optional and (got is None or want is None):
        if got is want:
            return None
        message = f"{field} is {fmt(got)}, expected {fmt(want)} (None exactly when the batch's is None)"
        return Violation(invariant_id, message, rank=record.rank, field=field)
    rows = spec.rows(record) if spec.rows is not None else None
    if spec.kind == "tensor":
        return check_tensor(invariant_id, record, field, got, want, *([rows] if rows else []))
    if spec.kind == "array":
        return check_array(invariant_id, record, field, got, want, spec.dtype, *([rows] if rows else []))
    if spec.kind == "str_list":
        return check_str_list(invariant_id, record, field, got, want, rows)
    return check_int(invariant_id, record, field, got, want)


def _local_fields_checker(invariant_id: str, fields: tuple[LocalField, ...]):
    def check(record: StepRecord) -> Iterable[Violation]:
        pair = _local_batches(record)
        if pair is None:
            return []
        for spec in fields:  # the first field that differs: the later ones usually follow from it
            violation = _compare(invariant_id, record, spec, *pair)
            if violation is not None:
                return [violation]
        return []

    check.__name__ = check.__qualname__ = "check_" + invariant_id.lower().replace("-", "_")
    return check


for _invariant_id, _fields in LOCAL_FIELDS.items():
    rank_check(_invariant_id)(_local_fields_checker(_invariant_id, _fields))


@rank_check("INV-LOCAL-ADMITTED-DRAFTS")
def check_local_admitted_drafts(record: StepRecord) -> Iterable[Violation]:
    """vllm-0.33: None, or the batch's admitted counts unchanged (no consumer reads it)."""
    pair = _local_batches(record)
    if pair is None:
        return
    field = "local_batch.num_admitted_draft_tokens"
    got, batch_value = (
        getattr(pair[0], "num_admitted_draft_tokens", None),
        record.inputs.batch.num_admitted_draft_tokens,
    )
    if got is None:
        return
    if batch_value is None or not isinstance(got, np.ndarray) or not np.array_equal(got, np.asarray(batch_value)):
        yield Violation(
            "INV-LOCAL-ADMITTED-DRAFTS",
            f"{field} is {fmt(got)}: expected None or the batch's value {fmt(batch_value)}",
            rank=record.rank,
            field=field,
        )


@rank_check("INV-LOCAL-GLOBAL-FIELDS")
def check_local_global_fields(record: StepRecord) -> Iterable[Violation]:
    pair = _local_batches(record)
    if pair is None:
        return
    # Token space is not sharded: every entry is judged, none maps to one request.
    yield from found(
        check_tensor(
            "INV-LOCAL-GLOBAL-FIELDS",
            record,
            "local_batch.query_start_loc",
            pair[0].query_start_loc,
            record.inputs.batch.query_start_loc,
        )
    )


ALIGNED_FIELDS = (
    "local_batch.idx_mapping",
    "local_batch.cu_num_logits",
    "local_batch.logits_indices",
    "local_batch.expanded_idx_mapping",
    "local_batch.expanded_local_pos",
    "local_batch.seq_lens",
    "metadata.gathered_src_indices",
)
ALIGNMENT_BYTES = 16


@rank_check("INV-LOCAL-ALIGNMENT")
def check_local_alignment(record: StepRecord) -> Iterable[Violation]:
    pair = shards(record)
    if pair is None:
        return
    shard = pair[0]
    for path in ALIGNED_FIELDS:
        owner, name = path.split(".")
        tensor = getattr(getattr(shard, owner), name)
        # Empty tensors read no memory; other checkers judge non-tensors.
        if not isinstance(tensor, torch.Tensor) or tensor.numel() == 0:
            continue
        address = tensor.data_ptr()
        if address % ALIGNMENT_BYTES:
            yield Violation(
                "INV-LOCAL-ALIGNMENT",
                f"{path} starts at address {address:#x}, "
                f"{address % ALIGNMENT_BYTES} bytes past a {ALIGNMENT_BYTES}-byte boundary",
                rank=record.rank,
                field=path,
            )
            return
