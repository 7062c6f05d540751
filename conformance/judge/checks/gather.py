"""The gathered result in batch order: sampled ids, counts, NaN sums, cu_num_generated_tokens."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from shardspec.conformance.judge.checks.base import StepRecord, Violation, rank_check
from shardspec.conformance.judge.checks.common import check_int_list, check_tensor, fmt, found, judgeable


def gathered_pair(record: StepRecord):
    """(actual, expected) gathered outputs when both exist and the case is judged, else None."""
    actual, expected = record.actual.gathered, record.expected.gathered
    if not judgeable(record) or actual is None or expected is None:
        return None
    return actual, expected


def by_request(row: int) -> int:
    return row


@rank_check("INV-GATHER-SAMPLED-IDS")
def check_gather_sampled_ids(record: StepRecord) -> Iterable[Violation]:
    actual = record.actual
    if judgeable(record) and actual.error is None and actual.gathered is None:
        yield Violation(
            "INV-GATHER-SAMPLED-IDS",
            "gather_sampler_output returned None instead of a SamplerOutput",
            rank=record.rank,
            field="gathered",
        )
        return
    pair = gathered_pair(record)
    if pair is None:
        return
    yield from found(
        check_tensor(
            "INV-GATHER-SAMPLED-IDS",
            record,
            "gathered.sampled_token_ids",
            pair[0].sampled_token_ids,
            pair[1].sampled_token_ids,
            by_request,
        )
    )


@rank_check("INV-GATHER-COUNTS")
def check_gather_counts(record: StepRecord) -> Iterable[Violation]:
    pair = gathered_pair(record)
    if pair is None:
        return
    actual, expected = pair
    yield from found(
        check_tensor(
            "INV-GATHER-COUNTS", record, "gathered.num_sampled", actual.num_sampled, expected.num_sampled, by_request
        ),
        check_tensor(
            "INV-GATHER-COUNTS", record, "gathered.num_rejected", actual.num_rejected, expected.num_rejected, by_request
        ),
    )


@rank_check("INV-GATHER-NANS")
def check_gather_nans(record: StepRecord) -> Iterable[Violation]:
    pair = gathered_pair(record)
    if pair is None:
        return
    actual, expected = pair
    if not record.case.gather_num_nans:
        if actual.num_nans is not None:
            yield Violation(
                "INV-GATHER-NANS",
                f"gathered.num_nans is {fmt(actual.num_nans)} without gather_num_nans, expected None",
                rank=record.rank,
                field="gathered.num_nans",
            )
        return
    if actual.num_nans is None:
        yield Violation(
            "INV-GATHER-NANS",
            f"gathered.num_nans is None, expected the per-request NaN sums {fmt(expected.num_nans)}",
            rank=record.rank,
            field="gathered.num_nans",
        )
        return
    yield from found(
        check_tensor("INV-GATHER-NANS", record, "gathered.num_nans", actual.num_nans, expected.num_nans, by_request)
    )


def _cu_num_generated_tensor(record: StepRecord, actual, expected) -> Iterable[Violation]:
    """vllm-0.33: the device prefix sums under adaptive verification, else None (INV-CU-NUM-GENERATED)."""
    field = "gathered.logprobs_tensors.cu_num_generated_tokens_tensor"
    got, want = getattr(actual, "cu_num_generated_tokens_tensor", None), expected.cu_num_generated_tokens_tensor
    if want is None or got is None:
        if got is not want:
            yield Violation(
                "INV-CU-NUM-GENERATED",
                f"{field} is {fmt(got)}, expected {fmt(want)} (set only under adaptive verification)",
                rank=record.rank,
                field=field,
            )
        return
    # That it is a tensor of its own, not the batch's, is INV-GATHER-RESULT-OWNED's to judge.
    yield from found(check_tensor("INV-CU-NUM-GENERATED", record, field, got, want, lambda k: max(k - 1, 0)))


@rank_check("INV-CU-NUM-GENERATED")
def check_cu_num_generated(record: StepRecord) -> Iterable[Violation]:
    pair = gathered_pair(record)
    if pair is None or pair[0].logprobs_tensors is None:
        return  # INV-LOGPROBS-SHAPES judges a missing logprobs_tensors
    field = "gathered.logprobs_tensors.cu_num_generated_tokens"
    got = pair[0].logprobs_tensors.cu_num_generated_tokens
    cu = np.asarray(record.inputs.batch.cu_num_logits_np)
    num_reqs, num_logits = cu.shape[0] - 1, int(cu[-1])
    if record.rules.adaptive:
        yield from _cu_num_generated_tensor(record, pair[0].logprobs_tensors, pair[1].logprobs_tensors)
        if record.case.adaptive_verification:
            if got is not None:
                yield Violation(
                    "INV-CU-NUM-GENERATED",
                    f"{field} is {fmt(got)} under adaptive verification, expected None "
                    "(cu_num_generated_tokens_tensor carries the admitted rows)",
                    rank=record.rank,
                    field=field,
                )
            return
    if num_logits == num_reqs:
        if got is not None:
            yield Violation(
                "INV-CU-NUM-GENERATED",
                f"{field} is {fmt(got)} with one logits row per request (L == N), expected None",
                rank=record.rank,
                field=field,
            )
        return
    counts = np.diff(cu)
    first_multi_row = int(np.flatnonzero(counts > 1)[0])
    if got is None:
        yield Violation(
            "INV-CU-NUM-GENERATED",
            f"{field} is None with L={num_logits} != N={num_reqs}, expected {fmt(cu.tolist())}",
            rank=record.rank,
            request=first_multi_row,
            field=field,
        )
        return
    yield from found(
        check_int_list(
            "INV-CU-NUM-GENERATED", record, field, got, [int(c) for c in cu], lambda entry: max(entry - 1, 0)
        )
    )
