"""The shard metadata: split sizes, plan scalars and the gathered source index."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from shardspec.conformance.judge.checks.base import StepRecord, Violation, rank_check
from shardspec.conformance.judge.checks.common import (
    check_int,
    check_int_list,
    check_tensor,
    empty_batch_padding,
    fmt,
    found,
    plan_of,
    shards,
)


def _first_request_of_rank(owners: np.ndarray):
    """Rank index -> its first request in batch order (None when it owns none)."""

    def request(rank: int):
        mine = np.flatnonzero(owners == rank)
        return int(mine[0]) if mine.size else None

    return request


@rank_check("INV-SPLITS")
def check_splits(record: StepRecord) -> Iterable[Violation]:
    pair = shards(record)
    if pair is None:
        return
    actual, expected = pair[0].metadata, pair[1].metadata
    owners = plan_of(record).owners
    per_rank = check_int_list(
        "INV-SPLITS",
        record,
        "metadata.num_logits_per_rank",
        actual.num_logits_per_rank,
        expected.num_logits_per_rank,
        _first_request_of_rank(np.asarray(owners)),
    )
    yield from found(
        per_rank,
        check_int(
            "INV-SPLITS",
            record,
            "metadata.num_local_logits",
            actual.num_local_logits,
            expected.num_logits_per_rank[record.rank],
        ),
    )


@rank_check("INV-META-SCALARS")
def check_meta_scalars(record: StepRecord) -> Iterable[Violation]:
    pair = shards(record)
    if pair is None:
        return
    actual, expected = pair[0].metadata, pair[1].metadata
    allowed = empty_batch_padding(record)
    chosen = getattr(actual, "max_num_reqs_per_rank", None)
    # An empty batch may pad to 0 or 1 rows where the padding rule allows both (CL-EMPTY-BATCH): judged
    # against the choice.
    padding = chosen if type(chosen) is int and chosen in allowed else expected.max_num_reqs_per_rank
    wanted = {name: getattr(expected, name) for name in ("tp_size", "num_local_reqs", "max_num_logits_per_req")}
    wanted["max_num_reqs_per_rank"] = padding
    for name in ("tp_size", "num_local_reqs", "max_num_reqs_per_rank", "max_num_logits_per_req"):
        violation = check_int("INV-META-SCALARS", record, f"metadata.{name}", getattr(actual, name), wanted[name])
        if violation:
            if name == "max_num_reqs_per_rank" and len(allowed) > 1:
                violation.message += f" (an empty batch pads to one of {list(allowed)})"
            yield violation
            return
    if record.rules.adaptive:
        field = "metadata.adaptive_verification_enabled"
        got = getattr(actual, "adaptive_verification_enabled", None)
        if got is not record.case.adaptive_verification:
            yield Violation(
                "INV-META-SCALARS",
                f"{field} is {fmt(got)}, expected {record.case.adaptive_verification} (the sharder's argument)",
                rank=record.rank,
                field=field,
            )


@rank_check("INV-GATHERED-SRC-INDICES")
def check_gathered_src_indices(record: StepRecord) -> Iterable[Violation]:
    pair = shards(record)
    if pair is None:
        return
    violation = check_tensor(
        "INV-GATHERED-SRC-INDICES",
        record,
        "metadata.gathered_src_indices",
        pair[0].metadata.gathered_src_indices,
        pair[1].metadata.gathered_src_indices,
        lambda row: row,
    )
    if violation:
        yield violation
