"""Defects that only the input space's new inputs show (conformance/cases/input_space.py, boundaries.py).

Each passed every case of the generators before them: the reject fixtures violate a slot range from
above only and give every rank a request, explicit logprobs were never above 0 and never NaN, and the
steps of a multi-step case all asked for the same logprobs. :data:`CASES` are the cases that expose
them, drawn by the new generators.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from shardspec.conformance.broken.cases import BY_ID
from shardspec.conformance.broken.profiles import BUNDLED_RULES
from shardspec.conformance.broken.support import LogprobsRewritingSharder, preconditions_unchecked
from shardspec.conformance.cases.boundaries import boundary_cases
from shardspec.conformance.cases.multistep import multi_step_cases
from shardspec.reference import ReferenceSharder
from shardspec.spec.case import Case, ExplicitLocalOutput
from shardspec.spec.case_edits import LOGITS_LIMITS_EDIT, UPPER_BOUND_ABSENT


class NegativeSlotsAccepted(ReferenceSharder):
    """INV-REJECT-INVALID: checks the slot range from above only: a negative slot is sharded by Python's modulo."""

    def shard_sampler_inputs(self, batch, grammar, **kwargs):
        slots = np.asarray(batch.idx_mapping_np)
        negative = slots.size > 0 and int(slots.min()) < 0 and int(slots.max()) < self.max_num_reqs
        if not negative:
            return super().shard_sampler_inputs(batch, grammar, **kwargs)
        with preconditions_unchecked(self):
            return super().shard_sampler_inputs(batch, grammar, **kwargs)


class IdleRanksCheckNothing(ReferenceSharder):
    """INV-REJECT-INVALID: a rank that owns no request checks the slots (to know that it owns none) and nothing else."""

    def shard_sampler_inputs(self, batch, grammar, **kwargs):
        slots = np.asarray(batch.idx_mapping_np, dtype=np.int64)
        in_range = slots.size == 0 or (int(slots.min()) >= 0 and int(slots.max()) < self.max_num_reqs)
        valid_slots = in_range and len(set(slots.tolist())) == slots.size
        if not valid_slots or (slots % self.tp_size == self.rank).any():
            return super().shard_sampler_inputs(batch, grammar, **kwargs)
        with preconditions_unchecked(self):
            return super().shard_sampler_inputs(batch, grammar, **kwargs)


class LogprobsClampedAtZero(LogprobsRewritingSharder):
    """INV-LOGPROBS-VALUES: clamps gathered logprobs to at most 0 (a log-probability never exceeds 0).

    +inf and the largest float32 come back as 0."""

    def rewrite_logprobs(self, lp, global_batch):
        return lp._replace(logprobs=lp.logprobs.clamp(max=0.0))


class LogprobNansAsMinusInf(LogprobsRewritingSharder):
    """INV-LOGPROBS-VALUES: gathered NaN logprobs come back as -inf (torch.nan_to_num)."""

    def rewrite_logprobs(self, lp, global_batch):
        values = torch.nan_to_num(lp.logprobs, nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
        return lp._replace(logprobs=values)


class LogprobsDimsOfFirstStep(ReferenceSharder):
    """INV-LOGPROBS-SHAPES: a step without logprobs_dims gathers logprobs at the dims of the sharder's first step."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        if not hasattr(self, "_first_dims"):
            self._first_dims = kwargs.get("logprobs_dims")
        if kwargs.get("logprobs_dims") is None and self._first_dims is not None:
            kwargs = {**kwargs, "logprobs_dims": self._first_dims}
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)


def _boundary(case_id: str) -> Case:
    return next(c for c in boundary_cases(BUNDLED_RULES["vllm-0.33"]) if c.case_id == case_id)


def _explicit_logprobs(case_id: str, value: float) -> Case:
    """Two ranks with explicit outputs; one logprob of rank 1 is ``value`` (a limit of float32)."""

    def out(first: int, rows: int, special: bool) -> ExplicitLocalOutput:
        logprobs = [[-0.5, -1.0, -2.0] for _ in range(rows)]
        if special:
            logprobs[0][1] = value
        return ExplicitLocalOutput(
            sampled_token_ids=[[first + r] for r in range(rows)],
            num_sampled=[1] * rows,
            num_rejected=[0] * rows,
            num_nans=[0] * rows,
            logprob_token_ids=[[first + r, 3, 4] for r in range(rows)],
            logprobs=logprobs,
            selected_token_ranks=[0] * rows,
        )

    return Case(
        case_id=case_id,
        tp_size=2,
        slots=[0, 1, 2, 3],
        num_logits_per_req=[1, 1, 1, 1],
        description=f"explicit outputs, one logprob {value}",
        logprobs_dims=(2, 0),
        local_outputs={0: out(10, 2, False), 1: out(20, 2, True)},
    )


def _multi_step() -> Case:
    return next(c for c in multi_step_cases(2, 4, 0) if c.logprobs_dims is not None)


def _profile_field_views() -> list[Case]:
    """vllm-0.33's seq_lens_cpu_upper_bound and num_admitted_draft_tokens as views, and the bound left out.

    Admitted counts 0, 1, 2, 0 of 2, 1, 2, 0 scheduled drafts: each view's neighbours (the counts rotated
    by one) give rank 0 other sums."""
    admitted = Case(
        case_id="admitted-drafts",
        tp_size=2,
        slots=[0, 1, 2, 3],
        num_logits_per_req=[3, 2, 3, 1],
        description="adaptive verification, admitted 0, 1, 2, 0",
        adaptive_verification=True,
        admitted_drafts=[0, 1, 2, 0],
    )
    views = [
        replace(admitted, case_id=f"{name.replace('_', '-')}-{layout}", layouts={name: layout})
        for name in ("seq_lens_cpu_upper_bound", "num_admitted_draft_tokens")
        for layout in ("strided", "offset")
    ]
    absent = replace(admitted, case_id="seq-lens-cpu-upper-bound-absent", edits=[UPPER_BOUND_ABSENT])
    return [admitted, *views, absent]


def _two_dimensional_views() -> list[Case]:
    """The logits shard, grammar bitmask and local sampler output of the targeted spec and grammar cases
    as the rows of a padded buffer and as a column slice of a wider one."""
    out = []
    for field, base in (("logits_shard", "spec"), ("grammar_bitmask", "grammar"), ("local_output", "spec")):
        for layout in ("row-padded", "column-slice"):
            case_id = f"{field.replace('_', '-')}-{layout}"
            out.append(replace(BY_ID[base], case_id=case_id, layouts={field: layout}))
    return out


def _logits_at_their_limits() -> list[Case]:
    """The targeted decode and spec cases with float32's limits in their logits, and decode in bfloat16."""
    out = [replace(BY_ID[i], case_id=f"{i}-logits-limits", edits=[LOGITS_LIMITS_EDIT]) for i in ("decode", "spec")]
    return [*out, replace(out[0], case_id="decode-bf16-logits-limits", logits_dtype="bfloat16")]


def _sampler_prefix_sums() -> list[Case]:
    """Explicit outputs whose logprobs carry the sampler's own prefix sums of its rows ([0, 1, 2] on each
    rank), which the gather does not read: as a list, as a tensor (vllm-0.33) and as a strided tensor."""
    base = _explicit_logprobs("sampler-cu", -3.0)

    def carrying(case_id: str, name: str, layouts: dict) -> Case:
        outputs = {rank: replace(out, **{name: [0, 1, 2]}) for rank, out in base.local_outputs.items()}
        return replace(base, case_id=case_id, local_outputs=outputs, layouts=layouts)

    return [
        carrying("sampler-cu-list", "cu_num_generated_tokens", {}),
        carrying("sampler-cu-tensor", "cu_num_generated_tokens_tensor", {}),
        carrying("sampler-cu-tensor-strided", "cu_num_generated_tokens_tensor", {"local_output": "strided"}),
    ]


def _one_short_and_one_long() -> list[Case]:
    """seq_lens and logits_indices one entry short (the old boundary cases) and one entry long (the new)."""
    names = {"seq-lens": "n", "logits-indices": "l"}
    return [
        replace(_boundary(f"tp2-reject-field-shapes-at-{name}-{side}-{size}-1"), case_id=f"{name}-one-{word}")
        for name, size in names.items()
        for side, word in (("below", "short"), ("above", "long"))
    ]


CASES = [
    replace(_boundary("tp2-reject-slot-range-at-idx-mapping-below-1"), case_id="negative-slot"),
    replace(_boundary("tp2-reject-dtypes-at-idx-mapping-np-other-float64"), case_id="float-host-slots"),
    replace(
        _boundary("tp4-reject-capacity-logits-at-cu-num-logits-above-max-num-logits-per-req-1"),
        case_id="idle-rank-reject",
    ),
    _explicit_logprobs("logprob-plus-inf", float("inf")),
    _explicit_logprobs("logprob-largest", 3.4028234663852886e38),
    _explicit_logprobs("logprob-nan", float("nan")),
    replace(_multi_step(), case_id="multi-step-options"),
    *_profile_field_views(),
    *_two_dimensional_views(),
    *_logits_at_their_limits(),
    *_sampler_prefix_sums(),
    *_one_short_and_one_long(),
]


class SamplerPrefixSumsPassedOn(ReferenceSharder):
    """INV-CU-NUM-GENERATED: the gathered cu_num_generated_tokens(_tensor) are the local sampler's own, when it
    returns them, instead of those the spec derives from the batch."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        out = super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
        mine = None if local_output is None else local_output.logprobs_tensors
        if out.logprobs_tensors is None or mine is None:
            return out
        names = ("cu_num_generated_tokens", "cu_num_generated_tokens_tensor")
        given = {name: getattr(mine, name) for name in names if getattr(mine, name) is not None}
        return replace(out, logprobs_tensors=out.logprobs_tensors._replace(**given)) if given else out


class UpperBoundMadeUpWhenAbsent(ReferenceSharder):
    """INV-LOCAL-SEQ-LENS-UPPER-BOUND: a batch without seq_lens_cpu_upper_bound gets one made from seq_lens.

    The local batch then carries a bound where the spec says None."""

    def shard_sampler_inputs(self, batch, grammar, **kwargs):
        if batch.seq_lens_cpu_upper_bound is None and self.rules.has_upper_bound:
            batch = replace(batch, seq_lens_cpu_upper_bound=batch.seq_lens.cpu())
        return super().shard_sampler_inputs(batch, grammar, **kwargs)


class LogitsClampedToHalfRange(ReferenceSharder):
    """INV-A2A-SPLITS: clamps the logits shard to float16's finite range before the exchange, as a cast guard would.

    Infinities and float32's largest come back as +-65504; the generated logits never come near it."""

    def all_to_all_logits(self, logits_shard, metadata):
        return super().all_to_all_logits(logits_shard.clamp(-65504.0, 65504.0), metadata)


class HostSlotsOfAnyDtype(ReferenceSharder):
    """INV-REJECT-INVALID: takes idx_mapping_np of any dtype, cast to integers, where PRE-DTYPES says integers.

    A float64 host copy of the slots is sharded as if it held integers."""

    def shard_sampler_inputs(self, batch, grammar, **kwargs):
        slots = batch.idx_mapping_np
        if slots is not None and np.asarray(slots).dtype.kind == "f":
            batch = replace(batch, idx_mapping_np=np.asarray(slots).astype(np.intp))
        return super().shard_sampler_inputs(batch, grammar, **kwargs)


class LengthsCheckedFromBelowOnly(ReferenceSharder):
    """INV-REJECT-INVALID: checks that seq_lens and logits_indices are long enough, not that they are exactly N
    and L long: one entry too many is cut off and the step goes on, where PRE-FIELD-SHAPES says reject."""

    def shard_sampler_inputs(self, batch, grammar, **kwargs):
        num_logits = int(np.asarray(batch.cu_num_logits_np)[-1]) if len(batch.cu_num_logits_np) else 0
        if batch.seq_lens.shape[0] > batch.num_reqs or batch.logits_indices.shape[0] > num_logits:
            batch = replace(
                batch, seq_lens=batch.seq_lens[: batch.num_reqs], logits_indices=batch.logits_indices[:num_logits]
            )
        return super().shard_sampler_inputs(batch, grammar, **kwargs)


class HalfInfinitiesClampedInBfloat16(ReferenceSharder):
    """INV-A2A-SPLITS: in bfloat16 logits, infinities become bfloat16's largest finite values before the exchange
    (a guard written for float16 applied to bfloat16); float32 and float16 logits pass untouched."""

    def all_to_all_logits(self, logits_shard, metadata):
        if logits_shard.dtype == torch.bfloat16:
            largest = torch.finfo(torch.bfloat16).max
            logits_shard = logits_shard.nan_to_num(nan=float("nan"), posinf=largest, neginf=-largest)
        return super().all_to_all_logits(logits_shard, metadata)
