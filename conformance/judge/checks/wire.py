"""The all-gather wire layout (part of the contract: mixed implementations share a group).

The per-rank checkers rebuild what the spec says a rank sends from the local
sampler output the rank was actually given, and compare only the rows that
carry data: padding rows are unspecified (CL-WIRE-PADDING) and never judged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from shardspec.conformance.judge.checks.base import StepRecord, Violation, group_check, rank_check
from shardspec.conformance.judge.checks.common import (
    first_differing_row,
    lookup,
    plan_of,
    row_violation,
    shards,
    wire_metadata,
)
from shardspec.conformance.record import OFF_GROUP, WireCall
from shardspec.spec.case import Case
from shardspec.spec.model import num_logprob_columns

ALL_GATHER = "all_gather_into_tensor"
PAD_TOKEN_ID, PAD_LOGPROB, PAD_SELECTED_RANK = 0, float("-inf"), 0


def _gathers(record: StepRecord) -> list[WireCall]:
    return [call for call in record.actual.wire if call.kind == ALL_GATHER]


def _gather_call(record: StepRecord, index: int, what: str, invariant_id: str, field: str):
    """(call, None), or (None, violation) when a completed step lacks it, or (None, None)."""
    calls = _gathers(record)
    if index < len(calls):
        return calls[index], None
    if record.actual.error is not None:
        return None, None  # the step stopped early; its error is reported once elsewhere
    return None, Violation(
        invariant_id,
        f"no all_gather of {what}: the step issued {len(calls)} all_gathers",
        rank=record.rank,
        field=field,
    )


def _compare_rows(
    invariant_id: str, record: StepRecord, field: str, call: WireCall, want: torch.Tensor, rows: np.ndarray, row_request
) -> Violation | None:
    """dtype and shape of the send buffer and of the received one, then the data-carrying ``rows`` only."""
    send = call.send
    if send.dtype != want.dtype or tuple(send.shape) != tuple(want.shape):
        return Violation(
            invariant_id,
            f"{field} sends {send.dtype} {list(send.shape)}, expected {want.dtype} {list(want.shape)}",
            rank=record.rank,
            field=field,
        )
    received = (record.case.tp_size * want.shape[0], *want.shape[1:])
    if tuple(call.output_shape) != received:
        return Violation(
            invariant_id,
            f"{field} receives into {list(call.output_shape)}, expected "
            f"{list(received)} (tp_size times the send buffer's rows)",
            rank=record.rank,
            field=field,
        )
    row = first_differing_row(send, want, rows)
    return None if row is None else row_violation(invariant_id, record, field, row, send, want, row_request(row))


def local_output_matches(record: StepRecord, metadata, local_cu: np.ndarray) -> bool:
    """Whether the rank's local sampler output has the spec's local batch's shape.

    It does not when the implementation's own local batch was wrong (a shard
    step violation, reported there); the wire is then not judged.
    """
    out, n, num_rows = record.actual.local_output, metadata.num_local_reqs, int(local_cu[-1])
    if out is None:
        return n == 0
    shapes = [
        (out.sampled_token_ids.shape[0], n),
        (tuple(out.num_sampled.shape), (n,)),
        (tuple(out.num_rejected.shape), (n,)),
    ]
    if record.case.gather_num_nans and out.num_nans is not None:
        shapes.append((tuple(out.num_nans.shape), (num_rows,)))
    if out.logprobs_tensors is not None:
        shapes.append((out.logprobs_tensors.logprobs.shape[0], num_rows))
    return all(got == want for got, want in shapes)


def expected_sampled_send(record: StepRecord, metadata, local_cu: np.ndarray) -> torch.Tensor:
    """[M, W + 2 (+1)] int64 with the data rows the spec prescribes; padding rows zero (never compared)."""
    width, n = metadata.max_num_logits_per_req, metadata.num_local_reqs
    with_nans = record.case.gather_num_nans
    send = torch.zeros(metadata.max_num_reqs_per_rank, width + 2 + int(with_nans), dtype=torch.int64)
    out = record.actual.local_output
    if out is None or n == 0:
        return send
    ids = out.sampled_token_ids.cpu().to(torch.int64)
    copied = min(ids.shape[1], width)
    send[:n, :copied] = ids[:, :copied]
    send[:n, width] = out.num_sampled.cpu().to(torch.int64)
    send[:n, width + 1] = out.num_rejected.cpu().to(torch.int64)
    if with_nans:
        row_nans = out.num_nans.cpu().to(torch.int64)
        send[:n, width + 2] = torch.tensor(
            [int(row_nans[local_cu[j] : local_cu[j + 1]].sum()) for j in range(n)], dtype=torch.int64
        )
    return send


@rank_check("INV-WIRE-SAMPLED")
def check_wire_sampled(record: StepRecord) -> Iterable[Violation]:
    pair = shards(record)
    if pair is None or record.actual.failed_step in ("shard", "all_to_all", "sample"):
        return
    field = "wire.all_gather_sampled"
    call, missing = _gather_call(record, 0, "sampled outputs", "INV-WIRE-SAMPLED", field)
    if call is None:
        if missing:
            yield missing
        return
    metadata = wire_metadata(record)
    local_cu = np.asarray(pair[1].local_batch.cu_num_logits_np, dtype=np.int64)
    if not local_output_matches(record, metadata, local_cu):
        return
    want = expected_sampled_send(record, metadata, local_cu)
    rows = np.arange(metadata.num_local_reqs)
    violation = _compare_rows("INV-WIRE-SAMPLED", record, field, call, want, rows, lookup(plan_of(record).local_reqs))
    if violation:
        yield violation


def expected_logprob_sends(record: StepRecord, metadata, local_cu: np.ndarray):
    """(ids [M*W, C+1] int64, values [M*W, C] float32, data rows) as the spec prescribes."""
    width, cols = metadata.max_num_logits_per_req, num_logprob_columns(record.case.logprobs_dims)
    num_rows = metadata.max_num_reqs_per_rank * width
    ids = torch.full((num_rows, cols + 1), PAD_TOKEN_ID, dtype=torch.int64)
    ids[:, cols] = PAD_SELECTED_RANK
    values = torch.full((num_rows, cols), PAD_LOGPROB, dtype=torch.float32)
    counts = np.diff(local_cu)
    # Local row k of local request j travels in wire row j * W + p.
    wire_rows = np.concatenate([j * width + np.arange(c) for j, c in enumerate(counts)] or [np.zeros(0, np.int64)])
    wire_rows = wire_rows.astype(np.int64)
    out = record.actual.local_output
    lp = None if out is None else out.logprobs_tensors
    if lp is not None and wire_rows.size:
        index = torch.from_numpy(wire_rows)
        copied = min(lp.logprob_token_ids.shape[1], cols)
        ids[index, :copied] = lp.logprob_token_ids[:, :copied].cpu().to(torch.int64)
        ids[index, cols] = lp.selected_token_ranks.cpu().to(torch.int64)
        values[index, :copied] = lp.logprobs[:, :copied].cpu().to(torch.float32)
    return ids, values, wire_rows


@rank_check("INV-WIRE-LOGPROBS")
def check_wire_logprobs(record: StepRecord) -> Iterable[Violation]:
    pair = shards(record)
    if (
        pair is None
        or record.case.logprobs_dims is None
        or record.actual.failed_step in ("shard", "all_to_all", "sample")
    ):
        return
    metadata = wire_metadata(record)
    local_cu = np.asarray(pair[1].local_batch.cu_num_logits_np, dtype=np.int64)
    if not local_output_matches(record, metadata, local_cu):
        return
    want_ids, want_values, rows = expected_logprob_sends(record, metadata, local_cu)
    local_reqs = plan_of(record).local_reqs
    width = metadata.max_num_logits_per_req

    def row_request(row: int) -> int | None:
        return lookup(local_reqs)(row // width)

    for index, what, field, want in (
        (1, "logprob ids and ranks", "wire.all_gather_logprob_ids", want_ids),
        (2, "logprob values", "wire.all_gather_logprobs", want_values),
    ):
        call, missing = _gather_call(record, index, what, "INV-WIRE-LOGPROBS", field)
        violation = (
            missing
            if call is None
            else _compare_rows("INV-WIRE-LOGPROBS", record, field, call, want, rows, row_request)
        )
        if violation:
            yield violation
            return


# -- the sequence, across ranks (digests of conformance.digest) --------------


def expected_kinds(case: Case) -> list[str]:
    logprobs = [ALL_GATHER, ALL_GATHER] if case.logprobs_dims is not None else []
    # One all_gather per declared extension field, after the named ones (CL-EXTENSION-FIELDS).
    return ["all_to_all_single", ALL_GATHER, *logprobs, *[ALL_GATHER] * len(case.extensions)]


def _agreement_key(call: dict[str, Any]) -> dict[str, Any]:
    """What must be identical on every rank: the output and split sizes of an all_to_all are per rank."""
    key = {"kind": call.get("kind"), "send_shape": call.get("send_shape"), "send_dtype": call.get("send_dtype")}
    if call.get("group") is not None:  # a group of the TP group's ranks the implementation built: the same one
        key["group"] = call["group"]
    if call.get("kind") == ALL_GATHER:
        key["output_shape"] = call.get("output_shape")
    else:
        key["input_split_sizes"] = call.get("input_split_sizes")
    return key


@group_check("INV-WIRE-SEQUENCE")
def check_wire_sequence(case: Case, digests: dict[int, dict[str, Any]]) -> Iterable[Violation]:
    """Every recorded call counts: the Communicator's methods, torch.distributed's collectives and
    point-to-point functions, the process group's methods and every collective operator, functional
    collectives included (all recorded by the harness), so an extra barrier or all_reduce fails here;
    so does any call on a group other than the TP group, which the recorder names with its group. A group the
    implementation built over exactly the TP group's ranks (vLLM builds its own) counts as the TP group where
    the step issues every call on it and every rank uses the same one."""
    # Rejected inputs issue no collectives; a rank that raised is reported as an error.
    if case.expect_error is not None or any(d.get("failed_step") for d in digests.values()):
        return
    want = expected_kinds(case)
    for rank in sorted(digests):
        kinds = [call.get("kind") for call in digests[rank].get("wire", [])]
        off_group = next((i for i, kind in enumerate(kinds) if OFF_GROUP in str(kind)), None)
        if off_group is not None:
            kind, _, group = str(kinds[off_group]).partition(OFF_GROUP)
            yield Violation(
                "INV-WIRE-SEQUENCE",
                f"collective {off_group} ({kind}) was issued on {group}, not on the step's TP group",
                rank=rank,
                field="wire.sequence",
            )
            return
        groups = [call.get("group") for call in digests[rank].get("wire", [])]
        other = next((i for i, group in enumerate(groups) if group != groups[0]), None)
        if other is not None:
            yield Violation(
                "INV-WIRE-SEQUENCE",
                f"collective {other} ({kinds[other]}) was issued on {_group_words(groups[other])}, collective 0 on "
                f"{_group_words(groups[0])}: a step's collectives go over one group, or a peer waits on the other",
                rank=rank,
                field="wire.sequence",
            )
            return
        if kinds != want:
            yield Violation(
                "INV-WIRE-SEQUENCE",
                f"{sequence_difference(kinds, want)}: issued {kinds}, expected {want}",
                rank=rank,
                field="wire.sequence",
            )
            return
        performed = digests[rank].get("collectives_performed")
        if performed is not None and performed > len(kinds):
            yield Violation(
                "INV-WIRE-SEQUENCE",
                f"the rank's process groups performed {performed} collectives in the step, the recorder saw "
                f"{len(kinds)}: {performed - len(kinds)} were issued around the recorder (a backend method "
                "captured before it, an operator run with torch's dispatch modes disabled, a switched-off recorder)",
                rank=rank,
                field="wire.sequence",
            )
            return
    first_rank = min(digests)
    base = [_agreement_key(call) for call in digests[first_rank]["wire"]]
    for rank in sorted(digests):
        for position, call in enumerate(digests[rank]["wire"]):
            if _agreement_key(call) != base[position]:
                yield Violation(
                    "INV-WIRE-SEQUENCE",
                    f"collective {position} is {_agreement_key(call)} on rank "
                    f"{rank} but {base[position]} on rank {first_rank}",
                    rank=rank,
                    field="wire.sequence",
                )
                return


def _group_words(group: str | None) -> str:
    return "the TP group" if group is None else group


def sequence_difference(kinds: list[str], want: list[str]) -> str:
    """The first call that differs, named: an extra one, a missing one, or one in another's place."""
    position = next(
        (i for i, (got, expected) in enumerate(zip(kinds, want, strict=False)) if got != expected),
        min(len(kinds), len(want)),
    )
    if position >= len(want):
        return f"extra {kinds[position]} at position {position}"
    if position >= len(kinds):
        return f"missing {want[position]} at position {position}"
    if kinds[position + 1 :] == want[position:]:
        return f"extra {kinds[position]} at position {position}"
    if kinds[position:] == want[position + 1 :]:
        return f"missing {want[position]} at position {position}"
    return f"{kinds[position]} at position {position} where {want[position]} belongs"
