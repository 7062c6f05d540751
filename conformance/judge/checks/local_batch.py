"""The local batch: every localized field on host and device, and the global ones."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from shardspec.conformance.judge.checks.base import StepRecord, Violation, rank_check
from shardspec.conformance.judge.checks.common import fmt, shards
from shardspec.conformance.judge.checks.fields import (
    ARRAY,
    INT,
    STR_LIST,
    TENSOR,
    Field,
    by_local_prefix_entry,
    by_local_request,
    by_local_row,
    field_check,
)

# Optional local fields are None exactly when the batch's are (the reference's is then None too).
BATCH_NONE = "None exactly when the batch's is None"

# Each invariant's fields, in the order they are judged.
field_check(
    "INV-LOCAL-REQS",
    Field("local_batch.req_ids", STR_LIST, by_local_request),
    Field("local_batch.num_reqs", INT),
)
field_check(
    "INV-LOCAL-IDX-MAPPING",
    Field("local_batch.idx_mapping", TENSOR, by_local_request),
    Field("local_batch.idx_mapping_np", ARRAY, by_local_request, np.intp),
)
field_check(
    "INV-LOCAL-CU-NUM-LOGITS",
    Field("local_batch.cu_num_logits", TENSOR, by_local_prefix_entry),
    Field("local_batch.cu_num_logits_np", ARRAY, by_local_prefix_entry, np.int32),
)
field_check("INV-LOCAL-LOGITS-INDICES", Field("local_batch.logits_indices", TENSOR, by_local_row))
field_check(
    "INV-LOCAL-EXPANDED",
    Field("local_batch.expanded_idx_mapping", TENSOR, by_local_row),
    Field("local_batch.expanded_local_pos", TENSOR, by_local_row),
)
field_check("INV-LOCAL-SEQ-LENS", Field("local_batch.seq_lens", TENSOR, by_local_request))
# vllm-0.33: the owned requests' host bounds, a CPU tensor.
field_check(
    "INV-LOCAL-SEQ-LENS-UPPER-BOUND",
    Field("local_batch.seq_lens_cpu_upper_bound", TENSOR, by_local_request, none_when=BATCH_NONE),
)
field_check(
    "INV-LOCAL-DRAFTS",
    Field("local_batch.num_draft_tokens_per_req", ARRAY, by_local_request, np.int32, none_when=BATCH_NONE),
    Field("local_batch.num_draft_tokens", INT),
)


@rank_check("INV-LOCAL-ADMITTED-DRAFTS")
def check_local_admitted_drafts(record: StepRecord) -> Iterable[Violation]:
    """vllm-0.33: None, or the batch's admitted counts unchanged (no consumer reads it)."""
    pair = shards(record)
    if pair is None:
        return
    field = "local_batch.num_admitted_draft_tokens"
    got = getattr(pair[0].local_batch, "num_admitted_draft_tokens", None)
    batch_value = record.inputs.batch.num_admitted_draft_tokens
    if got is None:
        return
    if batch_value is None or not isinstance(got, np.ndarray) or not np.array_equal(got, np.asarray(batch_value)):
        yield Violation(
            "INV-LOCAL-ADMITTED-DRAFTS",
            f"{field} is {fmt(got)}: expected None or the batch's value {fmt(batch_value)}",
            rank=record.rank,
            field=field,
        )


# Token space is not sharded: every entry is judged, none maps to one request; the reference's is the batch's.
field_check("INV-LOCAL-GLOBAL-FIELDS", Field("local_batch.query_start_loc", TENSOR))


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
