"""A corpus of deliberately broken sharders: each one defect, each caught by one named invariant.

Every entry is a subclass of the reference sharder (same factory signature)
whose docstring reads ``"<INVARIANT-ID>: <the defect>"``. The meta-tests run
each entry on its targeted cases (:mod:`.cases`) and require that invariant
among the violations, which proves the checkers can tell. Any entry also runs
through the command line::

    python -m shardspec.conformance --impl shardspec.conformance.broken.shard:OwnerBySlotDivision
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from shardspec.spec.profiles import DEFAULT_PROFILE, PROFILES, rules_of

PACKAGE = __name__
ALL_GROUPS = ("lockstep", "torch-threads")
TORCH_GROUPS = ("torch-threads",)


@dataclass(frozen=True)
class Entry:
    name: str  # readable id
    target: str  # "shardspec.conformance.broken.<module>:<class>", usable as --impl
    cases: tuple[str, ...]  # ids of cases in .cases that expose the defect
    # The in-process groups it runs in: defects that call torch.distributed need a group that has one.
    groups: tuple[str, ...] = ALL_GROUPS
    # The profiles its cases run under: a defect in one profile may be the rule of another (an int64
    # local idx_mapping is vllm-0.33's rule for an int64 batch, a defect in vllm-seed).
    profiles: tuple[str, ...] = (DEFAULT_PROFILE,)

    @property
    def factory(self):
        module, attr = self.target.split(":")
        return getattr(importlib.import_module(module), attr)

    @property
    def invariant_id(self) -> str:
        return self._doc()[0]

    @property
    def description(self) -> str:
        return self._doc()[1]

    def _doc(self) -> tuple[str, str]:
        invariant_id, _, description = (self.factory.__doc__ or "").strip().partition(": ")
        return invariant_id.split()[0] if invariant_id else "", description.strip()


def _entry(
    name: str,
    module: str,
    cls: str,
    *cases: str,
    groups: tuple[str, ...] = ALL_GROUPS,
    requires: dict[str, str] | None = None,
) -> Entry:
    """An entry run under the default profile, or (``requires``: rule values) under every bundled profile
    whose rules have those values (``{}``: every profile)."""
    return Entry(name, f"{PACKAGE}.{module}:{cls}", cases, groups, _profiles(requires))


def _profiles(requires: dict[str, str] | None) -> tuple[str, ...]:
    if requires is None:
        return (DEFAULT_PROFILE,)
    rules = {name: rules_of(name).as_dict() for name in PROFILES}
    return tuple(name for name in PROFILES if all(rules[name][k] == v for k, v in requires.items()))


CORPUS: list[Entry] = [
    # ownership and order
    _entry("owner-slot-division", "shard", "OwnerBySlotDivision", "decode", "spec", requires={"owner": "slot_mod_tp"}),
    _entry(
        "owner-by-slot-under-position",
        "shard",
        "OwnerBySlotUnderPositionRule",
        "decode",
        "idle-rank",
        requires={"owner": "position_mod_tp"},
    ),
    _entry("unstable-owner-sort", "shard", "UnstableOwnerSort", "decode", "spec"),
    _entry("src-indices-reversed", "shard", "SourceIndicesReversed", "decode"),
    # metadata
    _entry("splits-numpy-ints", "shard", "SplitsAsNumpyInts", "decode"),
    _entry("splits-count-requests", "shard", "SplitsCountRequests", "spec"),
    _entry(
        "empty-batch-zero-reqs-per-rank",
        "shard",
        "EmptyBatchZeroReqsPerRank",
        "empty",
        requires={"empty_batch_padding": "one"},
    ),
    # local batch
    _entry("req-ids-reversed", "shard", "ReqIdsReversed", "decode"),
    _entry("idx-mapping-int64", "shard", "IdxMappingInt64", "decode", requires={"local_dtypes": "fixed"}),
    _entry("idx-mapping-host-stale", "shard", "IdxMappingHostStale", "decode"),
    _entry("cu-num-logits-device-off-by-one", "shard", "CuNumLogitsDeviceOffByOne", "spec"),
    _entry("empty-rank-cu-num-logits-empty", "shard", "EmptyRankCuNumLogitsEmpty", "idle-rank"),
    _entry("idle-rank-prefix-sums-int32", "shard", "IdleRankPrefixSumsInt32", "idle-rank-int64-prefix-sums"),
    _entry("logits-indices-leading-rows", "shard", "LogitsIndicesLeadingRows", "spec"),
    _entry("expanded-local-pos-zero", "shard", "ExpandedLocalPosZero", "spec"),
    _entry("seq-lens-global", "shard", "SeqLensGlobal", "decode"),
    _entry("seq-lens-on-host", "shard", "SeqLensOnHost", "decode"),
    _entry("drafts-not-sliced", "shard", "DraftsNotSliced", "spec"),
    _entry("query-start-loc-localized", "shard", "QueryStartLocLocalized", "decode"),
    _entry("misaligned-idx-mapping", "shard", "MisalignedIdxMapping", "decode"),
    # grammar
    _entry("grammar-in-batch-order", "shard", "GrammarInBatchOrder", "grammar", requires={}),
    _entry("grammar-empty-instead-of-none", "shard", "GrammarEmptyInsteadOfNone", "grammar-one-rank"),
    _entry("grammar-dropped", "shard", "GrammarDropped", "grammar"),
    # all-to-all
    _entry("vocab-blocks-reversed", "exchange", "VocabBlocksReversed", "decode"),
    _entry("exchange-in-two-halves", "exchange", "ExchangeInTwoHalves", "decode"),
    _entry("result-column-major", "exchange", "ResultInColumnMajorOrder", "spec"),
    # sampled ids, counts, NaN sums, wire
    _entry("narrow-ids-filled-minus-one", "gather", "NarrowIdsFilledWithMinusOne", "explicit-widths"),
    _entry("counts-swapped", "gather", "CountsSwapped", "spec"),
    _entry("nan-sum-of-last-row", "gather", "NanSumOfLastRowOnly", "spec"),
    _entry("result-width-of-local-sampler", "gather", "ResultWidthOfLocalSampler", "explicit-widths", "spec"),
    _entry("counts-first-on-the-wire", "gather", "CountsFirstOnTheWire", "decode"),
    _entry("nan-counts-in-own-gather", "gather", "NanCountsInOwnGather", "decode"),
    # logprobs
    _entry("logprob-pad-zero", "logprobs", "LogprobPadZero", "explicit-narrow-logprobs"),
    _entry("logprob-width-ignores-token-ids", "logprobs", "LogprobWidthIgnoresTokenIds", "token-ids-wider"),
    _entry("missing-logprobs-as-zeros", "logprobs", "MissingLogprobsAsZeros", "explicit-missing-logprobs"),
    _entry("selected-ranks-dropped", "logprobs", "SelectedRanksDropped", "explicit-widths"),
    _entry("cu-num-generated-always-list", "logprobs", "CuNumGeneratedAlwaysList", "decode", requires={}),
    _entry("logprob-values-as-float64", "logprobs", "LogprobValuesAsFloat64", "decode"),
    # inputs and invalid inputs
    _entry("sanitizes-logits-in-place", "exchange", "SanitizesLogitsInPlace", "decode"),
    _entry("scratch-in-local-batch", "gather", "ScratchInLocalBatch", "decode"),
    _entry(
        "accepts-beyond-capacity",
        "rejection",
        "AcceptsBeyondCapacity",
        "error-capacity-reqs",
        "error-capacity-logits",
        "error-slot-range",
    ),
    _entry(
        "builds-for-any-group",
        "rejection",
        "BuildsForAnyGroup",
        "error-tp-size",
        "error-capacity-tp",
        requires={"construction": "sharded_groups"},
    ),
    _entry(
        "accepts-absent-upper-bound",
        "rejection",
        "AcceptsAbsentUpperBound",
        "error-bound-absent",
        requires={"seq_lens_upper_bound": "always"},
    ),
    _entry("anonymous-errors", "rejection", "AnonymousErrors", "error-logits-tail"),
    _entry("checks-nothing", "rejection", "ChecksNothing", "error-capacity-reqs", "error-slot-range"),
    _entry("accepts-on-odd-ranks", "rejection", "AcceptsOnOddRanks", "error-capacity-reqs", "error-zero-logits"),
    # what engines add: extension fields, their own batch fields
    _entry("drops-extension-field", "extensions", "DropsExtensionField", "extensions"),
    _entry("rebuilds-local-batch", "extensions", "RebuildsLocalBatch", "engine-batch"),
    _entry(
        "extension-entries-rotated-in-large-batches",
        "extensions",
        "ExtensionEntriesRotatedInLargeBatches",
        "extensions-many-requests",
    ),
]

CORPUS += [
    # more collectives than the spec's sequence
    _entry("extra-all-reduce", "collectives", "ExtraAllReduce", "decode", groups=TORCH_GROUPS),
    _entry("barrier-before-gather", "collectives", "BarrierBeforeGather", "decode", groups=TORCH_GROUPS),
    _entry("barrier-on-the-group-object", "collectives", "BarrierThroughTheGroupObject", "decode", groups=TORCH_GROUPS),
    _entry("extra-functional-all-reduce", "collectives", "ExtraFunctionalAllReduce", "decode", groups=TORCH_GROUPS),
    _entry("barrier-on-the-default-group", "collectives", "BarrierOnTheDefaultGroup", "decode", groups=TORCH_GROUPS),
    _entry("width-agreed-on-the-wire", "collectives", "WidthAgreedOnTheWire", "decode", "spec"),
    # views read as if contiguous
    _entry("seq-lens-unit-stride", "views", "SeqLensReadWithUnitStride", "strided-inputs"),
    _entry("logits-from-storage-start", "views", "LogitsShardFromStorageStart", "offset-inputs"),
    _entry("local-counts-unit-stride", "views", "LocalCountsReadWithUnitStride", "strided-local-output"),
    # dtypes that do not follow the inputs
    _entry("full-vocab-as-float32", "dtypes", "FullVocabAsFloat32", "decode-bf16"),
    # defects above some batch size or draft count
    _entry("local-slots-wrap-at-64", "scale", "LocalSlotsWrapAt64", "large-batch"),
    _entry("sampled-ids-capped-at-4", "scale", "SampledIdsCappedAtFourColumns", "many-drafts"),
    _entry("ids-reversed-above-3-reqs", "scale", "IdsReversedAboveThreeRequests", "decode"),
    # the wrong container type
    _entry("req-ids-tuple", "containers", "ReqIdsAsTuple", "decode"),
    _entry("grammar-ids-tuple", "containers", "GrammarIdsAsTuple", "grammar"),
    # state kept from one step to the next
    _entry("plan-cached-by-batch-size", "state", "PlanCachedByBatchSize", "multi-step"),
    _entry("sampled-ids-in-reused-buffer", "state", "SampledIdsInReusedBuffer", "multi-step"),
    _entry(
        "local-counts-returned-at-tp1",
        "state",
        "GatherReturnsLocalCountsAtTpOne",
        "decode-tp1",
        requires={"construction": "any_group"},  # a profile that builds a sharder for a group of one
    ),
    _entry("step-cached-by-requests", "state", "StepCachedByRequests", "decode-loop"),
    _entry("draft-counts-cached-by-request-set", "state", "DraftCountsCachedByRequestSet", "decode-loop"),
    # writes a thread makes after the step returned (the collectives of broken/unseen.py need a multi-process
    # world: tests/conformance/test_unseen_collectives.py)
    _entry("writes-input-after-returning", "unseen", "WritesItsInputAfterReturning", "decode"),
    _entry("writes-result-after-returning", "unseen", "WritesItsResultAfterReturning", "decode"),
]

CORPUS += [
    # vLLM 0.33's rules (under vllm-0.33, and under every profile with the rule value an entry requires)
    _entry(
        "seq-lens-upper-bound-global",
        "vllm033",
        "SeqLensUpperBoundGlobal",
        "adaptive-admitted-no-counts",
        requires={"seq_lens_upper_bound": "always"},
    ),
    _entry(
        "admitted-drafts-localized",
        "vllm033",
        "AdmittedDraftsLocalized",
        "adaptive-admitted-no-counts",
        requires={"admitted_drafts": "admitted"},
    ),
    _entry(
        "grammar-rows-not-blocks",
        "vllm033",
        "GrammarRowsNotBlocks",
        "adaptive-admitted-no-counts",
        "grammar",
        requires={"grammar_slicing": "blocks"},
    ),
    _entry(
        "acceptable-drafts-not-sliced",
        "vllm033",
        "AcceptableDraftsNotSliced",
        "adaptive-admitted",
        requires={"acceptable_drafts": "sliced"},
    ),
    _entry(
        "plan-follows-scheduled-counts",
        "vllm033",
        "PlanFollowsScheduledCounts",
        "adaptive-admitted-no-counts",
        requires={"admitted_drafts": "admitted"},
    ),
    _entry("local-drafts-scheduled", "vllm033", "LocalDraftsScheduled", "adaptive-budget-zero"),
    _entry(
        "cu-num-generated-seed-rule",
        "vllm033",
        "CuNumGeneratedSeedRule",
        "adaptive-admitted-no-counts",
        requires={"adaptive_verification": "present"},
    ),
    _entry(
        "adaptive-flag-dropped",
        "vllm033",
        "AdaptiveFlagDropped",
        "adaptive-budget-zero",
        requires={"adaptive_verification": "present"},
    ),
    _entry("local-idx-mapping-fixed-int32", "vllm033", "LocalIdxMappingFixedInt32", "decode"),
    _entry(
        "empty-batch-pads-to-two",
        "vllm033",
        "EmptyBatchPadsToTwo",
        "empty",
        requires={"empty_batch_padding": "zero_or_one"},
    ),
    _entry(
        "logprob-rows-admitted-only",
        "vllm033",
        "LogprobRowsAdmittedOnly",
        "adaptive-admitted-no-counts",
        requires={"admitted_drafts": "admitted"},
    ),
    _entry("extension-rows-scheduled", "vllm033", "ExtensionRowsScheduled", "adaptive-admitted-extensions"),
    # state kept from one step to the next, where a later step's profile inputs differ
    _entry(
        "local-drafts-cached-by-scheduled-drafts",
        "state",
        "LocalDraftsCachedByScheduledDrafts",
        "decode-loop-admitted",
        requires={"admitted_drafts": "admitted"},
    ),
    _entry(
        "local-idx-mapping-in-first-steps-dtype",
        "state",
        "LocalIdxMappingInFirstStepsDtype",
        "decode-loop-admitted",
        requires={"local_dtypes": "batch", "admitted_drafts": "admitted"},
    ),
]

CORPUS += [
    # inputs of the input space that the generators did not draw before (conformance/cases/input_space.py)
    _entry("negative-slots-accepted", "input_space", "NegativeSlotsAccepted", "negative-slot"),
    _entry("idle-ranks-check-nothing", "input_space", "IdleRanksCheckNothing", "idle-rank-reject"),
    _entry("logprobs-clamped-at-zero", "input_space", "LogprobsClampedAtZero", "logprob-plus-inf", "logprob-largest"),
    _entry("logprob-nans-as-minus-inf", "input_space", "LogprobNansAsMinusInf", "logprob-nan"),
    _entry("logprobs-dims-of-first-step", "input_space", "LogprobsDimsOfFirstStep", "multi-step-options"),
    _entry("upper-bound-unit-stride", "views", "UpperBoundReadWithUnitStride", "seq-lens-cpu-upper-bound-strided"),
    _entry(
        "admitted-from-buffer-start",
        "views",
        "AdmittedDraftsFromBufferStart",
        "num-admitted-draft-tokens-strided",
        "num-admitted-draft-tokens-offset",
    ),
    _entry(
        "logits-rows-packed", "views", "LogitsRowsAssumedPacked", "logits-shard-row-padded", "logits-shard-column-slice"
    ),
    _entry(
        "grammar-rows-packed",
        "views",
        "GrammarBitmaskRowsAssumedPacked",
        "grammar-bitmask-row-padded",
        "grammar-bitmask-column-slice",
    ),
    _entry(
        "local-logprobs-rows-packed",
        "views",
        "LocalLogprobsRowsAssumedPacked",
        "local-output-row-padded",
        "local-output-column-slice",
    ),
    _entry(
        "logits-clamped-to-half-range",
        "input_space",
        "LogitsClampedToHalfRange",
        "decode-logits-limits",
        "spec-logits-limits",
        "decode-bf16-logits-limits",
    ),
    _entry("host-slots-of-any-dtype", "input_space", "HostSlotsOfAnyDtype", "float-host-slots"),
    _entry(
        "half-infinities-clamped-in-bfloat16",
        "input_space",
        "HalfInfinitiesClampedInBfloat16",
        "decode-bf16-logits-limits",
    ),
    # Only where the bound may be absent (seq_lens_upper_bound: optional): no bundled profile since vllm-0.33
    # always passes it (a batch without it is PRE-SEQ-LENS-UPPER-BOUND there); tests/meta/test_input_space.py
    # runs it under the guide's engine profile (examples/engine_profile/engine.yaml), which has optional.
    _entry(
        "upper-bound-made-up",
        "input_space",
        "UpperBoundMadeUpWhenAbsent",
        "seq-lens-cpu-upper-bound-absent",
        requires={"seq_lens_upper_bound": "optional"},
    ),
    _entry(
        "lengths-checked-from-below-only",
        "input_space",
        "LengthsCheckedFromBelowOnly",
        "seq-lens-one-long",
        "logits-indices-one-long",
    ),
    _entry(
        "sampler-prefix-sums-passed-on",
        "input_space",
        "SamplerPrefixSumsPassedOn",
        "sampler-cu-list",
        "sampler-cu-tensor",
        "sampler-cu-tensor-strided",
    ),
    # a profile's field with an optional output, drawn together on purpose (cases/input_space.py)
    _entry(
        "grammar-dropped-without-upper-bound",
        "pairs",
        "GrammarDroppedWithoutUpperBound",
        "grammar-without-upper-bound",
        requires={"seq_lens_upper_bound": "optional"},
    ),
    # sizes at an end the generators did not draw before (conformance/cases/sizes.py)
    _entry(
        "grammar-listing-nothing-handed-on",
        "sizes",
        "GrammarListingNothingHandedOn",
        "grammar-lists-nothing",
        requires={},
    ),
    _entry(
        "logprob-columns-staged-in-fixed-buffer",
        "sizes",
        "LogprobColumnsStagedInFixedBuffer",
        "logprobs-whole-vocabulary",
        requires={},
    ),
    _entry(
        "extensions-none-when-none-declared", "sizes", "ExtensionsNoneWhenNoneDeclared", "extensions-declared-empty"
    ),
    _entry(
        "extension-fields-in-fixed-table", "sizes", "ExtensionFieldsInFixedTable", "extensions-every-kind-and-dtype"
    ),
    _entry(
        "extension-entries-staged-in-fixed-buffer",
        "sizes",
        "ExtensionEntriesStagedInFixedBuffer",
        "extension-entry-vocabulary-wide",
    ),
    _entry(
        "zero-width-ids-taken-for-an-idle-rank", "sizes", "ZeroWidthIdsTakenForAnIdleRank", "sampled-ids-width-zero"
    ),
    _entry("local-ids-skipped-past-fixed-buffer", "sizes", "LocalIdsSkippedPastFixedBuffer", "sampled-ids-wide"),
    _entry("zero-width-logprobs-taken-for-none", "sizes", "ZeroWidthLogprobsTakenForNone", "logprobs-width-zero"),
    _entry("local-logprobs-skipped-past-fixed-buffer", "sizes", "LocalLogprobsSkippedPastFixedBuffer", "logprobs-wide"),
]


_TABLE = {"owner": "owner_table"}
CORPUS += [
    # owners read from the engine's owner table (CL-OWNER-TABLE)
    _entry(
        "owner-by-position-ignoring-table",
        "owner_table",
        "OwnerByPositionIgnoringTable",
        "owner-table",
        "owner-table-steps",
        requires=_TABLE,
    ),
    _entry("owners-of-first-table", "owner_table", "OwnersOfFirstTable", "owner-table-steps", requires=_TABLE),
    _entry("assigns-the-table", "owner_table", "AssignsTheTable", "owner-table", requires=_TABLE),
    _entry("padding-from-whole-table", "owner_table", "PaddingFromWholeTable", "owner-table", requires=_TABLE),
    _entry(
        "owner-tables-compared-on-the-wire",
        "owner_table",
        "OwnerTablesComparedOnTheWire",
        "owner-table",
        requires=_TABLE,
    ),
    # contiguous_ranges: no bundled profile has it, so no bundled run reaches this entry;
    # tests/meta/test_contiguous_ranges.py runs it under examples/profiles/vllm-ascend-contiguous-ranges.yaml.
    _entry(
        "ranges-of-ceil-size",
        "shard",
        "RangesOfCeilSize",
        "contiguous-ranges",
        requires={"owner": "contiguous_ranges"},
    ),
]


def _register_input_space_cases() -> None:
    """The cases of broken/input_space.py, sizes.py and pairs.py join the targeted cases by id (not cases.ALL: the
    checks that run every entry on every targeted case stay the size they were; tests/meta/test_input_space.py
    runs the reference on these)."""
    from shardspec.conformance.broken import cases, input_space, pairs, sizes

    cases.BY_ID.update({case.case_id: case for case in input_space.CASES + sizes.CASES + pairs.CASES})


_register_input_space_cases()

BY_NAME = {entry.name: entry for entry in CORPUS}
