"""The local batch: every localized field on host and device, and the global ones."""

from __future__ import annotations

from collections.abc import Iterable

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


@rank_check("INV-LOCAL-REQS")
def check_local_reqs(record: StepRecord) -> Iterable[Violation]:
    pair = _local_batches(record)
    if pair is None:
        return
    actual, expected = pair
    violation = check_str_list(
        "INV-LOCAL-REQS", record, "local_batch.req_ids", actual.req_ids, expected.req_ids, _by_local_request(record)
    )
    if violation:
        yield violation
        return
    yield from found(check_int("INV-LOCAL-REQS", record, "local_batch.num_reqs", actual.num_reqs, expected.num_reqs))


@rank_check("INV-LOCAL-IDX-MAPPING")
def check_local_idx_mapping(record: StepRecord) -> Iterable[Violation]:
    pair = _local_batches(record)
    if pair is None:
        return
    actual, expected = pair
    by_request = _by_local_request(record)
    yield from found(
        check_tensor(
            "INV-LOCAL-IDX-MAPPING",
            record,
            "local_batch.idx_mapping",
            actual.idx_mapping,
            expected.idx_mapping,
            by_request,
        ),
        check_array(
            "INV-LOCAL-IDX-MAPPING",
            record,
            "local_batch.idx_mapping_np",
            actual.idx_mapping_np,
            expected.idx_mapping_np,
            np.intp,
            by_request,
        ),
    )


@rank_check("INV-LOCAL-CU-NUM-LOGITS")
def check_local_cu_num_logits(record: StepRecord) -> Iterable[Violation]:
    pair = _local_batches(record)
    if pair is None:
        return
    actual, expected = pair
    by_entry = _by_prefix_entry(record)
    yield from found(
        check_tensor(
            "INV-LOCAL-CU-NUM-LOGITS",
            record,
            "local_batch.cu_num_logits",
            actual.cu_num_logits,
            expected.cu_num_logits,
            by_entry,
        ),
        check_array(
            "INV-LOCAL-CU-NUM-LOGITS",
            record,
            "local_batch.cu_num_logits_np",
            actual.cu_num_logits_np,
            expected.cu_num_logits_np,
            np.int32,
            by_entry,
        ),
    )


@rank_check("INV-LOCAL-LOGITS-INDICES")
def check_local_logits_indices(record: StepRecord) -> Iterable[Violation]:
    pair = _local_batches(record)
    if pair is None:
        return
    yield from found(
        check_tensor(
            "INV-LOCAL-LOGITS-INDICES",
            record,
            "local_batch.logits_indices",
            pair[0].logits_indices,
            pair[1].logits_indices,
            _by_local_row(record),
        )
    )


@rank_check("INV-LOCAL-EXPANDED")
def check_local_expanded(record: StepRecord) -> Iterable[Violation]:
    pair = _local_batches(record)
    if pair is None:
        return
    actual, expected = pair
    by_row = _by_local_row(record)
    yield from found(
        check_tensor(
            "INV-LOCAL-EXPANDED",
            record,
            "local_batch.expanded_idx_mapping",
            actual.expanded_idx_mapping,
            expected.expanded_idx_mapping,
            by_row,
        ),
        check_tensor(
            "INV-LOCAL-EXPANDED",
            record,
            "local_batch.expanded_local_pos",
            actual.expanded_local_pos,
            expected.expanded_local_pos,
            by_row,
        ),
    )


@rank_check("INV-LOCAL-SEQ-LENS")
def check_local_seq_lens(record: StepRecord) -> Iterable[Violation]:
    pair = _local_batches(record)
    if pair is None:
        return
    yield from found(
        check_tensor(
            "INV-LOCAL-SEQ-LENS",
            record,
            "local_batch.seq_lens",
            pair[0].seq_lens,
            pair[1].seq_lens,
            _by_local_request(record),
        )
    )


@rank_check("INV-LOCAL-SEQ-LENS-UPPER-BOUND")
def check_local_seq_lens_upper_bound(record: StepRecord) -> Iterable[Violation]:
    """vllm-0.33: the owned requests' host bounds, a CPU tensor; None stays None."""
    pair = _local_batches(record)
    if pair is None:
        return
    field = "local_batch.seq_lens_cpu_upper_bound"
    got, want = getattr(pair[0], "seq_lens_cpu_upper_bound", None), pair[1].seq_lens_cpu_upper_bound
    if got is None or want is None:
        if got is not want:
            yield Violation(
                "INV-LOCAL-SEQ-LENS-UPPER-BOUND",
                f"{field} is {fmt(got)}, expected {fmt(want)} (None exactly when the batch's is None)",
                rank=record.rank,
                field=field,
            )
        return
    yield from found(
        check_tensor("INV-LOCAL-SEQ-LENS-UPPER-BOUND", record, field, got, want, _by_local_request(record))
    )


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


@rank_check("INV-LOCAL-DRAFTS")
def check_local_drafts(record: StepRecord) -> Iterable[Violation]:
    pair = _local_batches(record)
    if pair is None:
        return
    actual, expected = pair
    field = "local_batch.num_draft_tokens_per_req"
    got, want = actual.num_draft_tokens_per_req, expected.num_draft_tokens_per_req
    if (got is None) != (want is None):
        yield Violation(
            "INV-LOCAL-DRAFTS",
            f"{field} is {fmt(got)}, expected {fmt(want)} (None exactly when the batch's is None)",
            rank=record.rank,
            field=field,
        )
        return
    yield from found(
        None
        if want is None
        else check_array("INV-LOCAL-DRAFTS", record, field, got, want, np.int32, _by_local_request(record)),
        check_int(
            "INV-LOCAL-DRAFTS",
            record,
            "local_batch.num_draft_tokens",
            actual.num_draft_tokens,
            expected.num_draft_tokens,
        ),
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
