"""Who owns which request, and the owner-sorted order of logits rows."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from shardspec.conformance.judge.checks.base import StepRecord, Violation, rank_check
from shardspec.conformance.judge.checks.common import fmt, plan_of, shards
from shardspec.conformance.judge.checks.fields import TENSOR, Field, by_owner_sorted_row, field_check


@rank_check("INV-OWNER")
def check_owner(record: StepRecord) -> Iterable[Violation]:
    """The local batch holds exactly the requests the profile's owner rule gives this rank."""
    pair = shards(record)
    if pair is None:
        return
    local_batch, metadata = pair[0].local_batch, pair[0].metadata
    batch, plan = record.inputs.batch, plan_of(record)
    held = set(local_batch.req_ids)
    for i, req_id in enumerate(batch.req_ids):
        owned = plan.owners[i] == record.rank
        if owned != (req_id in held):
            slot = int(batch.idx_mapping_np[i])
            verdict = "lacks it" if owned else "holds it"
            yield Violation(
                "INV-OWNER",
                f"request {req_id!r} (slot {slot}) is owned by rank {plan.owners[i]}, "
                f"but this rank's local_batch.req_ids {verdict}: {fmt(list(local_batch.req_ids))}",
                rank=record.rank,
                request=i,
                field="local_batch.req_ids",
            )
            return
    owned_count = int(np.count_nonzero(plan.owners == record.rank))
    if metadata.num_local_reqs != owned_count:
        yield Violation(
            "INV-OWNER",
            f"metadata.num_local_reqs is {fmt(metadata.num_local_reqs)}, but this rank owns {owned_count} requests",
            rank=record.rank,
            field="metadata.num_local_reqs",
        )


field_check("INV-SORTED-LOGITS-INDICES", Field("sorted_logits_indices", TENSOR, by_owner_sorted_row))
