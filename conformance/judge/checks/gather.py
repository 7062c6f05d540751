"""The gathered result in batch order: sampled ids, counts, NaN sums, cu_num_generated_tokens."""

from __future__ import annotations

from collections.abc import Iterable

from shardspec.conformance.judge.checks.base import StepRecord, Violation, outputs_expected, rank_check
from shardspec.conformance.judge.checks.fields import (
    INT_LIST,
    TENSOR,
    Field,
    by_batch_position,
    by_prefix_entry,
    field_check,
    field_table,
)
from shardspec.reference.profile_rules import gathered_cu_num_generated


def gathered_pair(record: StepRecord):
    """(actual, expected) gathered outputs when both exist and the case is judged, else None."""
    actual, expected = record.actual.gathered, record.expected.gathered
    if not outputs_expected(record) or actual is None or expected is None:
        return None
    return actual, expected


SAMPLED_IDS = field_table("INV-GATHER-SAMPLED-IDS", Field("gathered.sampled_token_ids", TENSOR, by_batch_position))


@rank_check("INV-GATHER-SAMPLED-IDS")
def check_gather_sampled_ids(record: StepRecord) -> Iterable[Violation]:
    actual = record.actual
    if outputs_expected(record) and actual.error is None and actual.gathered is None:
        yield Violation(
            "INV-GATHER-SAMPLED-IDS",
            "gather_sampler_output returned None instead of a SamplerOutput",
            rank=record.rank,
            field="gathered",
        )
    elif SAMPLED_IDS.judged(record):
        yield from SAMPLED_IDS.violations(record)


# Each differing count is reported: neither follows from the other.
field_check(
    "INV-GATHER-COUNTS",
    Field("gathered.num_sampled", TENSOR, by_batch_position),
    Field("gathered.num_rejected", TENSOR, by_batch_position),
    each=True,
)
field_check(
    "INV-GATHER-NANS",
    Field("gathered.num_nans", TENSOR, by_batch_position, none_when="None exactly when gather_num_nans is off"),
)


def _spec_cu_num_generated(record: StepRecord) -> dict:
    """The spec's cu_num_generated_tokens (and, where the profile has adaptive verification, its device copy)
    for the batch, as the reference computes them: judged also on an implementation that returns logprobs
    the case did not ask for (where the reference returns none)."""
    return gathered_cu_num_generated(record.inputs.batch, record.case.adaptive_verification, record.rules)


# Each differing field is reported: the device prefix sums (vllm-0.33, under adaptive verification) do not
# follow from the host list. That the tensor is one of its own, not the batch's, is INV-GATHER-RESULT-OWNED's
# to judge.
CU_NUM_GENERATED = field_table(
    "INV-CU-NUM-GENERATED",
    Field(
        "gathered.logprobs_tensors.cu_num_generated_tokens_tensor",
        TENSOR,
        by_prefix_entry,
        none_when="set only under adaptive verification",
        judged_as=lambda record, _: _spec_cu_num_generated(record)["cu_num_generated_tokens_tensor"],
        when=lambda rules: rules.adaptive,
    ),
    Field(
        "gathered.logprobs_tensors.cu_num_generated_tokens",
        INT_LIST,
        by_prefix_entry,
        none_when="None under adaptive verification, where cu_num_generated_tokens_tensor carries the admitted "
        "rows, and with one logits row per request (L == N)",
        judged_as=lambda record, _: _spec_cu_num_generated(record)["cu_num_generated_tokens"],
    ),
    each=True,
)


@rank_check("INV-CU-NUM-GENERATED")
def check_cu_num_generated(record: StepRecord) -> Iterable[Violation]:
    pair = gathered_pair(record)
    if pair is None or pair[0].logprobs_tensors is None:
        return  # INV-LOGPROBS-SHAPES judges a missing logprobs_tensors
    yield from CU_NUM_GENERATED.violations(record)
