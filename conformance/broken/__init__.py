"""A corpus of deliberately broken sharders: each one defect, each caught by one named invariant.

Every entry is a subclass of the reference sharder (same factory signature)
whose docstring reads ``"<INVARIANT-ID>: <the defect>"``. The meta-tests run
each entry on its targeted cases (:mod:`.cases`) and require that invariant
among the violations, which proves the checkers can tell. Any entry also runs
through the command line::

    python -m shardspec.conformance --impl shardspec.conformance.broken.shard:OwnerBySlotDivision
"""

from __future__ import annotations

from shardspec.conformance.broken import cases, input_space, pairs, rule_entries, sizes, variations
from shardspec.conformance.broken.registry import TORCH_GROUPS, Entry, entry, within_contract

CORPUS: list[Entry] = [
    # ownership and order
    entry("owner-slot-division", "shard", "OwnerBySlotDivision", "decode", "spec", requires={"owner": "slot_mod_tp"}),
    entry(
        "owner-by-slot-under-position",
        "shard",
        "OwnerBySlotUnderPositionRule",
        "decode",
        "idle-rank",
        requires={"owner": "position_mod_tp"},
    ),
    entry("unstable-owner-sort", "shard", "UnstableOwnerSort", "decode", "spec"),
    entry("src-indices-reversed", "shard", "SourceIndicesReversed", "decode"),
    # metadata
    entry("splits-numpy-ints", "shard", "SplitsAsNumpyInts", "decode"),
    entry("splits-count-requests", "shard", "SplitsCountRequests", "spec"),
    entry(
        "empty-batch-zero-reqs-per-rank",
        "shard",
        "EmptyBatchZeroReqsPerRank",
        "empty",
        requires={"empty_batch_padding": "one"},
    ),
    # local batch
    entry("req-ids-reversed", "shard", "ReqIdsReversed", "decode"),
    entry("idx-mapping-int64", "shard", "IdxMappingInt64", "decode", requires={"local_dtypes": "fixed"}),
    entry("idx-mapping-host-stale", "shard", "IdxMappingHostStale", "decode"),
    entry("cu-num-logits-device-off-by-one", "shard", "CuNumLogitsDeviceOffByOne", "spec"),
    entry("empty-rank-cu-num-logits-empty", "shard", "EmptyRankCuNumLogitsEmpty", "idle-rank"),
    entry("idle-rank-prefix-sums-int32", "shard", "IdleRankPrefixSumsInt32", "idle-rank-int64-prefix-sums"),
    entry("logits-indices-leading-rows", "shard", "LogitsIndicesLeadingRows", "spec"),
    entry("expanded-local-pos-zero", "shard", "ExpandedLocalPosZero", "spec"),
    entry("seq-lens-global", "shard", "SeqLensGlobal", "decode"),
    entry("seq-lens-on-host", "shard", "SeqLensOnHost", "decode"),
    entry("drafts-not-sliced", "shard", "DraftsNotSliced", "spec"),
    entry("query-start-loc-localized", "shard", "QueryStartLocLocalized", "decode"),
    entry("misaligned-idx-mapping", "shard", "MisalignedIdxMapping", "decode"),
    # grammar
    entry("grammar-in-batch-order", "shard", "GrammarInBatchOrder", "grammar", requires={}),
    entry("grammar-empty-instead-of-none", "shard", "GrammarEmptyInsteadOfNone", "grammar-one-rank"),
    entry("grammar-dropped", "shard", "GrammarDropped", "grammar"),
    # all-to-all
    entry("vocab-blocks-reversed", "exchange", "VocabBlocksReversed", "decode"),
    entry("exchange-in-two-halves", "exchange", "ExchangeInTwoHalves", "decode"),
    entry("result-column-major", "exchange", "ResultInColumnMajorOrder", "spec"),
    # sampled ids, counts, NaN sums, wire
    entry("narrow-ids-filled-minus-one", "gather", "NarrowIdsFilledWithMinusOne", "explicit-widths"),
    entry("counts-swapped", "gather", "CountsSwapped", "spec"),
    entry("nan-sum-of-last-row", "gather", "NanSumOfLastRowOnly", "spec"),
    entry("result-width-of-local-sampler", "gather", "ResultWidthOfLocalSampler", "explicit-widths", "spec"),
    entry("counts-first-on-the-wire", "gather", "CountsFirstOnTheWire", "decode"),
    entry("nan-counts-in-own-gather", "gather", "NanCountsInOwnGather", "decode"),
    # logprobs
    entry("logprob-pad-zero", "logprobs", "LogprobPadZero", "explicit-narrow-logprobs"),
    entry("logprob-width-ignores-token-ids", "logprobs", "LogprobWidthIgnoresTokenIds", "token-ids-wider"),
    entry("missing-logprobs-as-zeros", "logprobs", "MissingLogprobsAsZeros", "explicit-missing-logprobs"),
    entry("selected-ranks-dropped", "logprobs", "SelectedRanksDropped", "explicit-widths"),
    entry("cu-num-generated-always-list", "logprobs", "CuNumGeneratedAlwaysList", "decode", requires={}),
    entry("logprob-values-as-float64", "logprobs", "LogprobValuesAsFloat64", "decode"),
    # inputs and invalid inputs
    entry("sanitizes-logits-in-place", "exchange", "SanitizesLogitsInPlace", "decode"),
    entry("scratch-in-local-batch", "gather", "ScratchInLocalBatch", "decode"),
    entry(
        "accepts-beyond-capacity",
        "rejection",
        "AcceptsBeyondCapacity",
        "error-capacity-reqs",
        "error-capacity-logits",
        "error-slot-range",
    ),
    entry(
        "builds-for-any-group",
        "rejection",
        "BuildsForAnyGroup",
        "error-tp-size",
        "error-capacity-tp",
        requires={"construction": "sharded_groups"},
    ),
    entry(
        "accepts-absent-upper-bound",
        "rejection",
        "AcceptsAbsentUpperBound",
        "error-bound-absent",
        requires={"seq_lens_upper_bound": "always"},
    ),
    entry("anonymous-errors", "rejection", "AnonymousErrors", "error-logits-tail"),
    entry("checks-nothing", "rejection", "ChecksNothing", "error-capacity-reqs", "error-slot-range"),
    entry("accepts-on-odd-ranks", "rejection", "AcceptsOnOddRanks", "error-capacity-reqs", "error-zero-logits"),
    # what engines add: extension fields, their own batch fields
    entry("drops-extension-field", "extensions", "DropsExtensionField", "extensions"),
    entry("rebuilds-local-batch", "extensions", "RebuildsLocalBatch", "engine-batch"),
    entry(
        "extension-entries-rotated-in-large-batches",
        "extensions",
        "ExtensionEntriesRotatedInLargeBatches",
        "extensions-many-requests",
    ),
]

CORPUS += [
    # more collectives than the spec's sequence
    entry("extra-all-reduce", "collectives", "ExtraAllReduce", "decode", groups=TORCH_GROUPS),
    entry("barrier-before-gather", "collectives", "BarrierBeforeGather", "decode", groups=TORCH_GROUPS),
    entry("barrier-on-the-group-object", "collectives", "BarrierThroughTheGroupObject", "decode", groups=TORCH_GROUPS),
    entry("extra-functional-all-reduce", "collectives", "ExtraFunctionalAllReduce", "decode", groups=TORCH_GROUPS),
    entry("barrier-on-the-default-group", "collectives", "BarrierOnTheDefaultGroup", "decode", groups=TORCH_GROUPS),
    entry(
        "all-to-all-on-the-default-group",
        "collectives",
        "AllToAllOnTheDefaultGroup",
        "decode",
        groups=TORCH_GROUPS,
        tp_groups=2,
    ),
    entry("width-agreed-on-the-wire", "collectives", "WidthAgreedOnTheWire", "decode", "spec"),
    # views read as if contiguous
    entry("seq-lens-unit-stride", "views", "SeqLensReadWithUnitStride", "strided-inputs"),
    entry("logits-from-storage-start", "views", "LogitsShardFromStorageStart", "offset-inputs"),
    entry("local-counts-unit-stride", "views", "LocalCountsReadWithUnitStride", "strided-local-output"),
    # dtypes that do not follow the inputs
    entry("full-vocab-as-float32", "dtypes", "FullVocabAsFloat32", "decode-bf16"),
    # defects above some batch size or draft count
    entry("local-slots-wrap-at-64", "scale", "LocalSlotsWrapAt64", "large-batch"),
    entry("sampled-ids-capped-at-4", "scale", "SampledIdsCappedAtFourColumns", "many-drafts"),
    entry("ids-reversed-above-3-reqs", "scale", "IdsReversedAboveThreeRequests", "decode"),
    entry("rows-shifted-past-512-requests", "scale", "RowsShiftedPast512Requests", "deployed-requests"),
    entry("columns-shifted-past-4096", "scale", "ColumnsShiftedPast4096", "deployed-vocabulary"),
    # the wrong container type
    entry("req-ids-tuple", "containers", "ReqIdsAsTuple", "decode"),
    entry("grammar-ids-tuple", "containers", "GrammarIdsAsTuple", "grammar"),
    # state kept from one step to the next
    entry("plan-cached-by-batch-size", "state", "PlanCachedByBatchSize", "multi-step"),
    entry("sampled-ids-in-reused-buffer", "state", "SampledIdsInReusedBuffer", "multi-step"),
    entry(
        "local-counts-returned-at-tp1",
        "state",
        "GatherReturnsLocalCountsAtTpOne",
        "decode-tp1",
        requires={"construction": "any_group"},  # a profile that builds a sharder for a group of one
    ),
    entry("step-cached-by-requests", "state", "StepCachedByRequests", "decode-loop"),
    entry("draft-counts-cached-by-request-set", "state", "DraftCountsCachedByRequestSet", "decode-loop"),
    # writes a thread makes after the step returned (the collectives of broken/unseen.py need a multi-process
    # world: tests/conformance/test_unseen_collectives.py)
    entry("writes-input-after-returning", "unseen", "WritesItsInputAfterReturning", "decode"),
    entry("writes-result-after-returning", "unseen", "WritesItsResultAfterReturning", "decode"),
]

CORPUS += rule_entries.ENTRIES


def _register_input_space_cases() -> None:
    """The cases of broken/input_space.py, sizes.py, pairs.py and variations.py, and the deployed sizes', join the
    targeted cases by id (not cases.ALL: the checks that run every entry on every targeted case stay the size they
    were; tests/meta/test_input_space.py runs the reference on the first three)."""
    made = input_space.CASES + sizes.CASES + pairs.CASES + variations.CASES
    cases.BY_ID.update({case.case_id: case for case in made})
    cases.BY_ID.update({case.case_id: case for case in cases.DEPLOYED})


_register_input_space_cases()


def _within_contract() -> list[Entry]:
    return [within_contract(entry, cases.BY_ID) for entry in CORPUS]


CORPUS = _within_contract()

BY_NAME = {entry.name: entry for entry in CORPUS}
