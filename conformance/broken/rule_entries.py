"""Entries of the broken corpus that follow a profile's rules (vLLM 0.33's, state across steps where profile inputs
differ, owner tables, contiguous ranges) or an end of the input space the generators did not draw before."""

from __future__ import annotations

from shardspec.conformance.broken.registry import Entry, entry

ENTRIES: list[Entry] = [
    # vLLM 0.33's rules (under vllm-0.33, and under every profile with the rule value an entry requires)
    entry(
        "seq-lens-upper-bound-global",
        "vllm033",
        "SeqLensUpperBoundGlobal",
        "adaptive-admitted-no-counts",
        requires={"seq_lens_upper_bound": "always"},
    ),
    entry(
        "admitted-drafts-localized",
        "vllm033",
        "AdmittedDraftsLocalized",
        "adaptive-admitted-no-counts",
        requires={"admitted_drafts": "admitted"},
    ),
    entry(
        "grammar-rows-not-blocks",
        "vllm033",
        "GrammarRowsNotBlocks",
        "adaptive-admitted-no-counts",
        "grammar",
        requires={"grammar_slicing": "blocks"},
    ),
    entry(
        "acceptable-drafts-not-sliced",
        "vllm033",
        "AcceptableDraftsNotSliced",
        "adaptive-admitted",
        requires={"acceptable_drafts": "sliced"},
    ),
    entry(
        "plan-follows-scheduled-counts",
        "vllm033",
        "PlanFollowsScheduledCounts",
        "adaptive-admitted-no-counts",
        requires={"admitted_drafts": "admitted"},
    ),
    entry("local-drafts-scheduled", "vllm033", "LocalDraftsScheduled", "adaptive-budget-zero"),
    entry(
        "cu-num-generated-seed-rule",
        "vllm033",
        "CuNumGeneratedSeedRule",
        "adaptive-admitted-no-counts",
        requires={"adaptive_verification": "present"},
    ),
    entry(
        "adaptive-flag-dropped",
        "vllm033",
        "AdaptiveFlagDropped",
        "adaptive-budget-zero",
        requires={"adaptive_verification": "present"},
    ),
    entry("local-idx-mapping-fixed-int32", "vllm033", "LocalIdxMappingFixedInt32", "decode"),
    entry(
        "empty-batch-pads-to-two",
        "vllm033",
        "EmptyBatchPadsToTwo",
        "empty",
        requires={"empty_batch_padding": "zero_or_one"},
    ),
    entry(
        "logprob-rows-admitted-only",
        "vllm033",
        "LogprobRowsAdmittedOnly",
        "adaptive-admitted-no-counts",
        requires={"admitted_drafts": "admitted"},
    ),
    entry("extension-rows-scheduled", "vllm033", "ExtensionRowsScheduled", "adaptive-admitted-extensions"),
    # state kept from one step to the next, where a later step's profile inputs differ
    entry(
        "local-drafts-cached-by-scheduled-drafts",
        "state",
        "LocalDraftsCachedByScheduledDrafts",
        "decode-loop-admitted",
        requires={"admitted_drafts": "admitted"},
    ),
    entry(
        "local-idx-mapping-in-first-steps-dtype",
        "state",
        "LocalIdxMappingInFirstStepsDtype",
        "decode-loop-admitted",
        requires={"local_dtypes": "batch", "admitted_drafts": "admitted"},
    ),
]

ENTRIES += [
    # inputs of the input space that the generators did not draw before (conformance/cases/input_space.py)
    entry("negative-slots-accepted", "input_space", "NegativeSlotsAccepted", "negative-slot"),
    entry("idle-ranks-check-nothing", "input_space", "IdleRanksCheckNothing", "idle-rank-reject"),
    entry("logprobs-clamped-at-zero", "input_space", "LogprobsClampedAtZero", "logprob-plus-inf", "logprob-largest"),
    entry("logprob-nans-as-minus-inf", "input_space", "LogprobNansAsMinusInf", "logprob-nan"),
    entry("logprobs-dims-of-first-step", "input_space", "LogprobsDimsOfFirstStep", "multi-step-options"),
    entry("upper-bound-unit-stride", "views", "UpperBoundReadWithUnitStride", "seq-lens-cpu-upper-bound-strided"),
    entry(
        "admitted-from-buffer-start",
        "views",
        "AdmittedDraftsFromBufferStart",
        "num-admitted-draft-tokens-strided",
        "num-admitted-draft-tokens-offset",
    ),
    entry(
        "logits-rows-packed", "views", "LogitsRowsAssumedPacked", "logits-shard-row-padded", "logits-shard-column-slice"
    ),
    entry(
        "grammar-rows-packed",
        "views",
        "GrammarBitmaskRowsAssumedPacked",
        "grammar-bitmask-row-padded",
        "grammar-bitmask-column-slice",
    ),
    entry(
        "local-logprobs-rows-packed",
        "views",
        "LocalLogprobsRowsAssumedPacked",
        "local-output-row-padded",
        "local-output-column-slice",
    ),
    entry(
        "logits-clamped-to-half-range",
        "input_space",
        "LogitsClampedToHalfRange",
        "decode-logits-limits",
        "spec-logits-limits",
        "decode-bf16-logits-limits",
    ),
    entry("host-slots-of-any-dtype", "input_space", "HostSlotsOfAnyDtype", "float-host-slots"),
    entry(
        "half-infinities-clamped-in-bfloat16",
        "input_space",
        "HalfInfinitiesClampedInBfloat16",
        "decode-bf16-logits-limits",
    ),
    # Only where the bound may be absent (seq_lens_upper_bound: optional): no bundled profile since vllm-0.33
    # always passes it (a batch without it is PRE-SEQ-LENS-UPPER-BOUND there); tests/meta/test_input_space.py
    # runs it under the guide's engine profile (examples/engine_profile/engine.yaml), which has optional.
    entry(
        "upper-bound-made-up",
        "input_space",
        "UpperBoundMadeUpWhenAbsent",
        "seq-lens-cpu-upper-bound-absent",
        requires={"seq_lens_upper_bound": "optional"},
    ),
    entry(
        "lengths-checked-from-below-only",
        "input_space",
        "LengthsCheckedFromBelowOnly",
        "seq-lens-one-long",
        "logits-indices-one-long",
    ),
    entry(
        "sampler-prefix-sums-passed-on",
        "input_space",
        "SamplerPrefixSumsPassedOn",
        "sampler-cu-list",
        "sampler-cu-tensor",
        "sampler-cu-tensor-strided",
    ),
    # a profile's field with an optional output, drawn together on purpose (cases/input_space.py)
    entry(
        "grammar-dropped-without-upper-bound",
        "pairs",
        "GrammarDroppedWithoutUpperBound",
        "grammar-without-upper-bound",
        requires={"seq_lens_upper_bound": "optional"},
    ),
    # sizes at an end the generators did not draw before (conformance/cases/sizes.py)
    entry(
        "grammar-listing-nothing-handed-on",
        "sizes",
        "GrammarListingNothingHandedOn",
        "grammar-lists-nothing",
        requires={},
    ),
    entry(
        "logprob-columns-staged-in-fixed-buffer",
        "sizes",
        "LogprobColumnsStagedInFixedBuffer",
        "logprobs-whole-vocabulary",
        requires={},
    ),
    entry("extensions-none-when-none-declared", "sizes", "ExtensionsNoneWhenNoneDeclared", "extensions-declared-empty"),
    entry("extension-fields-in-fixed-table", "sizes", "ExtensionFieldsInFixedTable", "extensions-every-kind-and-dtype"),
    entry(
        "extension-entries-staged-in-fixed-buffer",
        "sizes",
        "ExtensionEntriesStagedInFixedBuffer",
        "extension-entry-vocabulary-wide",
    ),
    entry("zero-width-ids-taken-for-an-idle-rank", "sizes", "ZeroWidthIdsTakenForAnIdleRank", "sampled-ids-width-zero"),
    entry("local-ids-skipped-past-fixed-buffer", "sizes", "LocalIdsSkippedPastFixedBuffer", "sampled-ids-wide"),
    entry("zero-width-logprobs-taken-for-none", "sizes", "ZeroWidthLogprobsTakenForNone", "logprobs-width-zero"),
    entry("local-logprobs-skipped-past-fixed-buffer", "sizes", "LocalLogprobsSkippedPastFixedBuffer", "logprobs-wide"),
]

ENTRIES += [
    # what callers may send, drawn on purpose (conformance/cases/input_space.py): each dtype a field accepts
    entry(
        "upper-bound-localized-in-int32",
        "variations",
        "UpperBoundLocalizedInInt32",
        "upper-bound-int64",
        requires={"seq_lens_upper_bound": "always", "dtypes": "accepted"},
    ),
    # ... and each relation of the slots to the batch positions (conformance/cases/relations.py)
    entry(
        "local-slots-numbered-like-positions", "variations", "LocalSlotsNumberedLikeLocalPositions", "slots-identical"
    ),
    entry("reversed-slots-gathered-in-slot-order", "variations", "ReversedSlotsGatheredInSlotOrder", "slots-reversed"),
    entry("identity-judged-by-its-ends", "variations", "IdentityJudgedByItsEnds", "slots-permuted"),
    entry("ascending-slots-taken-as-consecutive", "variations", "AscendingSlotsTakenAsConsecutive", "slots-gaps"),
    entry("slots-rebased-when-all-past-n", "variations", "SlotsRebasedWhenAllPastN", "slots-above-n"),
]


_TABLE = {"owner": "owner_table"}
ENTRIES += [
    # owners read from the engine's owner table (CL-OWNER-TABLE)
    entry(
        "owner-by-position-ignoring-table",
        "owner_table",
        "OwnerByPositionIgnoringTable",
        "owner-table",
        "owner-table-steps",
        requires=_TABLE,
    ),
    entry("owners-of-first-table", "owner_table", "OwnersOfFirstTable", "owner-table-steps", requires=_TABLE),
    entry("assigns-the-table", "owner_table", "AssignsTheTable", "owner-table", requires=_TABLE),
    entry("padding-from-whole-table", "owner_table", "PaddingFromWholeTable", "owner-table", requires=_TABLE),
    entry(
        "owner-tables-compared-on-the-wire",
        "owner_table",
        "OwnerTablesComparedOnTheWire",
        "owner-table",
        requires=_TABLE,
    ),
    # the table carried across a step in each form the contract allows (conformance/cases/owner_tables.py)
    entry(
        "rewrite-taken-for-a-fresh-table",
        "owner_table",
        "RewriteTakenForAFreshTable",
        "owner-table-rewritten",
        requires=_TABLE,
    ),
    entry(
        "changed-table-taken-for-a-full-rewrite",
        "owner_table",
        "ChangedTableTakenForAFullRewrite",
        "owner-table-rewritten-in-part",
        requires=_TABLE,
    ),
    entry(
        "unchanged-table-rewritten-by-sharder",
        "owner_table",
        "UnchangedTableRewrittenBySharder",
        "owner-table-kept",
        requires=_TABLE,
    ),
    # contiguous_ranges: no bundled profile has it, so no bundled run reaches this entry;
    # tests/meta/test_contiguous_ranges.py runs it under examples/profiles/vllm-ascend-contiguous-ranges.yaml.
    entry(
        "ranges-of-ceil-size",
        "shard",
        "RangesOfCeilSize",
        "contiguous-ranges",
        requires={"owner": "contiguous_ranges"},
    ),
]
