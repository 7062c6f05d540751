"""The logits exchange: one all_to_all_single with the plan's split sizes, rebuilt full-vocab rows.

INV-A2A-SPLITS owns the exchange on the wire (wire.all_to_all): its split
sizes, its send buffer (the logits shard the caller passed, values, dtype and
shape: an implementation that reads a strided shard as contiguous sends other
rows) and the buffer it receives into. INV-A2A-LAYOUT owns what
all_to_all_logits returns: in the logits' dtype, as contiguous rows.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from shardspec.conformance.judge.checks.base import StepRecord, Violation, rank_check
from shardspec.conformance.judge.checks.common import first_bad_row, fmt, found, shards, values_equal
from shardspec.conformance.judge.checks.fields import TENSOR, Field, by_local_row, by_owner_sorted_row, field_table
from shardspec.conformance.record import WireCall
from shardspec.spec.case import local_logits_shard
from shardspec.spec.layouts import logits_dtype_of

A2A = "all_to_all_single"


@rank_check("INV-A2A-SPLITS")
def check_a2a_splits(record: StepRecord) -> Iterable[Violation]:
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
        yield Violation(
            "INV-A2A-SPLITS",
            f"the step issued {len(calls)} {A2A} calls, expected exactly 1",
            rank=record.rank,
            field="wire.all_to_all",
        )
        return
    call = calls[0]
    for name, got, want in (
        ("input_split_sizes", call.input_split_sizes, want_in),
        ("output_split_sizes", call.output_split_sizes, want_out),
    ):
        if list(got or []) != want:
            yield Violation(
                "INV-A2A-SPLITS",
                f"{A2A} {name} {got}, expected {want}",
                rank=record.rank,
                field=f"wire.all_to_all.{name}",
            )
            return
    yield from found(_check_a2a_buffers(record, call, pair))


def _check_a2a_buffers(record: StepRecord, call: WireCall, pair) -> Violation | None:
    """The send buffer is the caller's logits shard [L, Vs]; the receive buffer is [tp * L_local, Vs]."""
    actual, expected = pair
    sorted_indices = expected.sorted_logits_indices
    if not torch.equal(actual.sorted_logits_indices.cpu(), sorted_indices.cpu()):
        return None  # the caller gathered other rows; INV-SORTED-LOGITS-INDICES reports why
    want = local_logits_shard(record.inputs, sorted_indices, record.case, record.rank)
    field, send = "wire.all_to_all", call.send
    if send.dtype != want.dtype or tuple(send.shape) != tuple(want.shape):
        return Violation(
            "INV-A2A-SPLITS",
            f"{A2A} sends {send.dtype} {list(send.shape)}, expected the logits shard's {want.dtype} {list(want.shape)}",
            rank=record.rank,
            field=field,
        )
    bad = first_bad_row(values_equal(send, want.to(send.device)))
    if bad is not None:
        return Violation(
            "INV-A2A-SPLITS",
            f"{A2A} send row {bad} is {fmt(send[bad])}, but the logits shard the "
            f"caller passed holds {fmt(want[bad])} there",
            rank=record.rank,
            request=by_owner_sorted_row(record)(bad),
            field=field,
        )
    received = (record.case.tp_size * expected.metadata.num_local_logits, want.shape[1])
    if tuple(call.output_shape) != received:
        return Violation(
            "INV-A2A-SPLITS",
            f"{A2A} receives into {list(call.output_shape)}, expected {list(received)}",
            rank=record.rank,
            field=field,
        )
    return None


# The values of the rebuilt rows; their dtype and layout are judged before them, against the spec's.
LAYOUT_VALUES = field_table("INV-A2A-LAYOUT", Field("full_vocab_logits", TENSOR, by_local_row))


@rank_check("INV-A2A-LAYOUT")
def check_a2a_layout(record: StepRecord) -> Iterable[Violation]:
    if shards(record) is None:
        return
    actual, expected = record.actual.full_vocab_logits, record.expected.full_vocab_logits
    if expected is None or (actual is None and record.actual.error is not None):
        return
    logits_dtype = logits_dtype_of(record.case.logits_dtype)
    if isinstance(actual, torch.Tensor) and actual.dtype != logits_dtype:
        yield Violation(
            "INV-A2A-LAYOUT",
            f"full_vocab_logits: dtype {actual.dtype}, expected the logits' dtype {logits_dtype}",
            rank=record.rank,
            field="full_vocab_logits",
        )
        return
    if isinstance(actual, torch.Tensor) and actual.dim() == 2 and not actual.is_contiguous():
        yield Violation(
            "INV-A2A-LAYOUT",
            f"full_vocab_logits: strides {tuple(actual.stride())}, expected contiguous rows "
            f"({(actual.shape[1], 1)}; CL-A2A-RESULT-CONTIGUOUS)",
            rank=record.rank,
            field="full_vocab_logits",
        )
    yield from LAYOUT_VALUES.violations(record)
