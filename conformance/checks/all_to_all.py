"""The logits exchange: one all_to_all_single with the plan's split sizes, rebuilt full-vocab rows."""

from __future__ import annotations

from typing import Iterable

from shardspec.conformance.checks.base import StepRecord, Violation, rank_check
from shardspec.conformance.checks.common import (
    check_tensor, found, local_row_owner, lookup, plan_of, shards, unexpected_error,
)

A2A = "all_to_all_single"


@rank_check("INV-A2A-SPLITS")
def check_a2a_splits(record: StepRecord) -> Iterable[Violation]:
    yield from unexpected_error(record, "INV-A2A-SPLITS")
    pair = shards(record)
    if pair is None:
        return
    calls = [call for call in record.actual.wire if call.kind == A2A]
    if not calls and record.actual.full_vocab_logits is None:
        return  # the exchange never ran; the error is reported above
    metadata = pair[1].metadata
    want_in = list(metadata.num_logits_per_rank)
    want_out = [metadata.num_local_logits] * metadata.tp_size
    if len(calls) != 1:
        yield Violation("INV-A2A-SPLITS", f"the step issued {len(calls)} {A2A} calls, expected exactly 1",
                        rank=record.rank, field="wire.all_to_all")
        return
    call = calls[0]
    for name, got, want in (("input_split_sizes", call.input_split_sizes, want_in),
                            ("output_split_sizes", call.output_split_sizes, want_out)):
        if list(got or []) != want:
            yield Violation("INV-A2A-SPLITS", f"{A2A} {name} {got}, expected {want}",
                            rank=record.rank, field=f"wire.all_to_all.{name}")
            return


@rank_check("INV-A2A-LAYOUT")
def check_a2a_layout(record: StepRecord) -> Iterable[Violation]:
    yield from unexpected_error(record, "INV-A2A-LAYOUT")
    if shards(record) is None:
        return
    actual, expected = record.actual.full_vocab_logits, record.expected.full_vocab_logits
    if expected is None or (actual is None and record.actual.error is not None):
        return
    by_row = lookup(local_row_owner(plan_of(record)))
    yield from found(check_tensor("INV-A2A-LAYOUT", record, "full_vocab_logits", actual, expected, by_row))
