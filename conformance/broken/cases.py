"""Small targeted cases that expose the corpus's defects (tp 2 or 3, at most 5 requests; DEPLOYED at deployed sizes).

Positions and token indices are chosen by hand; comments say what each case
makes observable.
"""

from __future__ import annotations

from dataclasses import replace

from shardspec.conformance.broken.profiles import BUNDLED_RULES
from shardspec.conformance.cases.deployment import deployment_cases
from shardspec.conformance.cases.owner_tables import carried
from shardspec.spec.case import Case, ExplicitLocalOutput
from shardspec.spec.case_edits import UPPER_BOUND_ABSENT
from shardspec.spec.layouts import BATCH_ARRAYS, BATCH_TENSORS, LOCAL_OUTPUT, OFFSET, STRIDED
from shardspec.spec.model import DEFAULT_PROFILE
from shardspec.spec.rules import Rules


def corpus_case(case_id: str, **fields) -> Case:
    """A targeted case of the corpus (tp 2 unless ``fields`` say otherwise; the default profile's rules unless
    they give others)."""
    fields.setdefault("tp_size", 2)
    return Case(case_id=case_id, description=f"corpus case {case_id}", **fields)


def _rejected(name: str, precondition: str, slots: list[int], counts: list[int], **fields) -> Case:
    """A case that breaks ``precondition``, with ``counts`` logits rows of the requests in ``slots``."""
    return corpus_case(f"error-{name}", slots=slots, num_logits_per_req=counts, expect_error=precondition, **fields)


def _requests_of(base: Case, case_id: str, **fields) -> Case:
    """A case of ``base``'s requests (its slots and logits rows), with ``fields`` and nothing else of ``base``."""
    return corpus_case(case_id, slots=base.slots, num_logits_per_req=base.num_logits_per_req, **fields)


# Ranks own 2 and 3 requests; token 2 holds NaNs.
DECODE = corpus_case("decode", slots=[0, 1, 2, 3, 5], num_logits_per_req=[1] * 5, nan_tokens=[2])

# W = 3. Rank 0 owns positions 0, 2, 4 (n = 2, 3, 2); rank 1 owns 1, 3 (n = 1, 1), so
# its toy sampler is the regular one (width 1). Tokens 1 and 7 are non-last rows
# of requests 0 and 2; token 4 is request 1's only row.
SPEC = corpus_case("spec", slots=[4, 1, 2, 3, 6], num_logits_per_req=[2, 1, 3, 1, 2], nan_tokens=[1, 4, 7])

# The grammar lists rank 0's requests in an order other than batch order.
GRAMMAR = corpus_case(
    "grammar", slots=[0, 1, 2, 3, 4], num_logits_per_req=[1, 2, 1, 1, 1], grammar_positions=[4, 1, 0, 2]
)

# Only rank 0's requests have a grammar.
GRAMMAR_ONE_RANK = corpus_case(
    "grammar-one-rank", slots=[0, 1, 2, 3], num_logits_per_req=[1, 1, 1, 1], grammar_positions=[2, 0]
)

# Rank 2 owns nothing under either owner rule (by slot rank 0 owns both requests; by position ranks 0
# and 1 own one each), and the two rules disagree on request 1's owner.
IDLE_RANK = corpus_case("idle-rank", tp_size=3, slots=[0, 3], num_logits_per_req=[1, 2])

EMPTY = corpus_case("empty", slots=[], num_logits_per_req=[])

# Agreed logprob width 1 + max(1, 3) = 4.
TOKEN_IDS_WIDER = corpus_case("token-ids-wider", slots=[0, 1, 2], num_logits_per_req=[1, 1, 1], logprobs_dims=(1, 3))

# Explicit local outputs. Rank 0 owns positions 0, 2 (n = 2, 3: 5 rows), rank 1
# owns 1, 3 (n = 1, 1: 2 rows); W = 3.
_SLOTS, _COUNTS = [0, 1, 2, 3], [2, 1, 3, 1]


def _logprobs(first_id: int, rows: int, cols: int) -> dict:
    return {
        "logprob_token_ids": [[first_id + 10 * r + c for c in range(cols)] for r in range(rows)],
        "logprobs": [[-(r + 0.25 * (c + 1)) for c in range(cols)] for r in range(rows)],
        "selected_token_ranks": [r % 3 for r in range(rows)],
    }


def _explicit(ids: list[list[int]], rows: int, logprob_cols: int | None, first_id: int) -> ExplicitLocalOutput:
    lp = _logprobs(first_id, rows, logprob_cols) if logprob_cols else {}
    return ExplicitLocalOutput(
        sampled_token_ids=ids,
        num_sampled=[1] * len(ids),
        num_rejected=[0] * len(ids),
        num_nans=[r % 2 for r in range(rows)],
        **lp,
    )


# Rank 0's sampler is 1 wide (narrower than W), rank 1's 4 wide (wider).
WIDTHS = corpus_case(
    "explicit-widths",
    slots=_SLOTS,
    num_logits_per_req=_COUNTS,
    local_outputs={
        0: _explicit([[11], [12]], 5, 3, 100),
        1: _explicit([[21, 22, 23, 24], [25, 26, 27, 28]], 2, 3, 200),
    },
)

# Agreed logprob width 4: rank 0 supplies 2 columns, rank 1 supplies 5.
NARROW_LOGPROBS = corpus_case(
    "explicit-narrow-logprobs",
    slots=_SLOTS,
    num_logits_per_req=_COUNTS,
    logprobs_dims=(3, 0),
    local_outputs={0: _explicit([[11, 12, 13], [14, 0, 0]], 5, 2, 100), 1: _explicit([[21], [22]], 2, 5, 200)},
)

# Rank 1's sampler returns no logprobs.
MISSING_LOGPROBS = corpus_case(
    "explicit-missing-logprobs",
    slots=_SLOTS,
    num_logits_per_req=_COUNTS,
    local_outputs={0: _explicit([[11, 12, 13], [14, 0, 0]], 5, 3, 100), 1: _explicit([[21], [22]], 2, None, 200)},
)

# Invalid inputs.
CAPACITY_REQS = _rejected("capacity-reqs", "PRE-CAPACITY-REQS", [0, 1, 2, 3, 4], [1] * 5, max_num_reqs=4)
CAPACITY_LOGITS = _rejected("capacity-logits", "PRE-CAPACITY-LOGITS", [0, 1], [1, 5])
SLOT_RANGE = _rejected("slot-range", "PRE-SLOT-RANGE", [3, 64], [1, 1])
ZERO_LOGITS = _rejected("zero-logits", "PRE-LOGITS-PER-REQ", [0, 1, 2], [1, 0, 2])
# Construction refused under vllm-0.33 and vllm-0.34 (construction: sharded_groups): a group of one, one slot for
# two ranks.
TP_SIZE = _rejected("tp-size", "PRE-TP-SIZE", [0, 1], [1, 1], tp_size=1)
CAPACITY_TP = _rejected("capacity-tp", "PRE-CAPACITY-TP", [0], [1], max_num_reqs=1)
# No seq_lens_cpu_upper_bound where the engine always passes it (seq_lens_upper_bound: always).
BOUND_ABSENT = _rejected("bound-absent", "PRE-SEQ-LENS-UPPER-BOUND", [0, 1, 2], [1] * 3, edits=[UPPER_BOUND_ABSENT])
# A precondition whose outcome is undefined, which the reference rejects anyway.
LOGITS_TAIL = _rejected("logits-tail", "PRE-LOGITS-TAIL", [0, 1, 2], [1] * 3, edits=["logits-indices-reversed"])

# Extension fields of three dtypes and both kinds; rank 2 owns nothing (spec decode rows on rank 0).
EXTENSIONS = corpus_case(
    "extensions",
    tp_size=3,
    slots=[0, 3, 1, 4],
    num_logits_per_req=[1, 2, 1, 1],
    extensions={
        "sampling_mask": {"per": "logits_row", "dtype": "int32", "shape": [4]},
        "asked": {"per": "request", "dtype": "bool"},
        "temperature": {"per": "request", "dtype": "bfloat16", "shape": [2]},
    },
)

# Eight requests whose owners interleave, with a per-row and a per-request extension field.
EXTENSIONS_MANY = corpus_case(
    "extensions-many-requests",
    tp_size=2,
    slots=[5, 0, 3, 6, 1, 2, 7, 4],
    num_logits_per_req=[1, 2, 1, 1, 3, 1, 2, 1],
    extensions={
        "num_kept": {"per": "logits_row", "dtype": "int32", "shape": []},
        "asked": {"per": "request", "dtype": "bool"},
    },
)

# An engine's batch type with a field the spec does not list.
ENGINE_BATCH = corpus_case("engine-batch", slots=[0, 1, 2], num_logits_per_req=[1, 1, 1], edits=["engine-batch-field"])

ALL = [
    DECODE,
    SPEC,
    GRAMMAR,
    GRAMMAR_ONE_RANK,
    IDLE_RANK,
    EMPTY,
    TOKEN_IDS_WIDER,
    WIDTHS,
    NARROW_LOGPROBS,
    MISSING_LOGPROBS,
    CAPACITY_REQS,
    CAPACITY_LOGITS,
    SLOT_RANGE,
    ZERO_LOGITS,
    TP_SIZE,
    CAPACITY_TP,
    BOUND_ABSENT,
    LOGITS_TAIL,
    EXTENSIONS,
    EXTENSIONS_MANY,
    ENGINE_BATCH,
]
# SPEC's batch with every batch field and the logits shard passed as views (spec/layouts.py):
# every other element of an interleaved buffer, or a slice three elements into its storage.
_VIEWED = BATCH_TENSORS + BATCH_ARRAYS + ("logits_shard",)
STRIDED_INPUTS = _requests_of(SPEC, "strided-inputs", layouts={name: STRIDED for name in _VIEWED})
OFFSET_INPUTS = _requests_of(SPEC, "offset-inputs", layouts={name: OFFSET for name in _VIEWED})
# SPEC's local sampler outputs as every-other-element views (rank 0's num_sampled is [2, 1, 2]).
STRIDED_LOCAL_OUTPUT = _requests_of(SPEC, "strided-local-output", layouts={LOCAL_OUTPUT: STRIDED})
# DECODE with bfloat16 logits: the exchange must return bfloat16 rows.
DECODE_BF16 = _requests_of(DECODE, "decode-bf16", nan_tokens=DECODE.nan_tokens, logits_dtype="bfloat16")
# 150 requests: each rank owns 75, more than a 64-entry block.
LARGE_BATCH = corpus_case(
    "large-batch",
    slots=list(range(150)),
    num_logits_per_req=[1 + s % 2 for s in range(150)],
    max_num_reqs=256,
    vocab_size=8,
)
# Up to 7 draft tokens: W = 8; rank 0's toy sampler is 6 wide, rank 1's 8.
MANY_DRAFTS = corpus_case("many-drafts", slots=[0, 1, 2, 3], num_logits_per_req=[6, 8, 2, 5], max_num_logits_per_req=8)
ALL += [STRIDED_INPUTS, OFFSET_INPUTS, STRIDED_LOCAL_OUTPUT, DECODE_BF16, LARGE_BATCH, MANY_DRAFTS]
# Three steps on one sharder: four requests, four requests in slots owned the other way round, then two.
MULTI_STEP = corpus_case(
    "multi-step",
    slots=[0, 1, 2, 3],
    num_logits_per_req=[1, 2, 1, 1],
    then=[
        corpus_case("multi-step", slots=[5, 6, 7, 8], num_logits_per_req=[1, 1, 2, 1]),
        corpus_case("multi-step", slots=[6, 1], num_logits_per_req=[2, 1]),
    ],
)
ALL += [MULTI_STEP]
# The same four requests three steps running, as a decode loop has them: each seq_len one token longer,
# then the rows per request changed by the drafts.
DECODE_LOOP = corpus_case(
    "decode-loop",
    slots=[0, 1, 2, 3],
    num_logits_per_req=[1, 2, 1, 1],
    then=[
        corpus_case("decode-loop", slots=[0, 1, 2, 3], num_logits_per_req=[1, 2, 1, 1], seq_lens_growth=1),
        corpus_case("decode-loop", slots=[0, 1, 2, 3], num_logits_per_req=[2, 1, 3, 1], seq_lens_growth=2),
    ],
)
ALL += [DECODE_LOOP]
# One rank: the gather could hand the local output back unchanged.
DECODE_TP1 = corpus_case("decode-tp1", tp_size=1, slots=[0, 1, 2, 3], num_logits_per_req=[1, 2, 1, 1])
ALL += [DECODE_TP1]
BY_ID = {case.case_id: case for case in ALL}


# vLLM 0.33's inputs (profile vllm-0.33). Adaptive verification with the budget binding: rank 0 owns
# positions 0, 2 (scheduled 3 and 1 rows, admitted 2 and 1), rank 1 owns 1, 3 (scheduled 2 and 3,
# admitted 1 and 3); the grammar lists 3 and 0 in blocks of 5 rows (padding rows past every request's),
# with acceptable-draft counts; expanded_idx_mapping int64 (vLLM's own dtype there), which the local batch follows.
def _adaptive(case_id: str, counts: list[int], admitted: list[int], **fields) -> Case:
    """Four requests in slots 0 to 3 with ``counts`` scheduled rows, ``admitted`` of their drafts admitted."""
    return corpus_case(
        case_id,
        slots=[0, 1, 2, 3],
        num_logits_per_req=counts,
        adaptive_verification=True,
        admitted_drafts=admitted,
        **fields,
    )


ADMITTED = _adaptive(
    "adaptive-admitted",
    [3, 2, 1, 3],
    [1, 0, 0, 2],
    grammar_positions=[3, 0],
    grammar_block_rows=5,
    num_acceptable_drafts=[2, 1],
    batch_dtypes={"expanded_idx_mapping": "int64"},
)
# A budget of 0: every request keeps one row, so every rank samples with the regular sampler.
BUDGET_ZERO = _adaptive("adaptive-budget-zero", [2, 3, 1, 2], [0, 0, 0, 0])
# ADMITTED's batch with a per-row and a per-request extension field: 6 admitted rows of 9 scheduled.
ADMITTED_EXTENSIONS = _requests_of(
    ADMITTED,
    "adaptive-admitted-extensions",
    adaptive_verification=True,
    admitted_drafts=ADMITTED.admitted_drafts,
    extensions={
        "sampling_mask": {"per": "logits_row", "dtype": "int32", "shape": [2]},
        "asked": {"per": "request", "dtype": "bool"},
    },
)
# ADMITTED's batch and grammar blocks without acceptable-draft counts: it holds for vllm-0.34 too.
ADMITTED_NO_COUNTS = _requests_of(
    ADMITTED,
    "adaptive-admitted-no-counts",
    adaptive_verification=True,
    admitted_drafts=ADMITTED.admitted_drafts,
    grammar_positions=ADMITTED.grammar_positions,
    grammar_block_rows=ADMITTED.grammar_block_rows,
    batch_dtypes=ADMITTED.batch_dtypes,
)
# One request (rank 1 owns nothing under either owner rule) in an int64 batch: the idle rank's local
# cu_num_logits follows the batch's dtype (CL-EMPTY-RANK, CL-LOCAL-DTYPES).
IDLE_RANK_INT64 = corpus_case(
    "idle-rank-int64-prefix-sums", slots=[4], num_logits_per_req=[2], batch_dtypes={"cu_num_logits": "int64"}
)
ALL += [ADMITTED, BUDGET_ZERO, ADMITTED_EXTENSIONS, ADMITTED_NO_COUNTS, IDLE_RANK_INT64]


# ADMITTED's requests two steps running with the same scheduled rows, the budget binding otherwise on the
# second (the admitted counts differ), then in an int32 batch: what a sharder keeps from its first step
# shows on the later ones.
def _admitted_step(**fields) -> Case:
    """A step of ADMITTED's requests with their scheduled rows, under adaptive verification."""
    return _requests_of(ADMITTED, "decode-loop-admitted", adaptive_verification=True, **fields)


DECODE_LOOP_ADMITTED = _admitted_step(
    admitted_drafts=ADMITTED.admitted_drafts,
    then=[
        _admitted_step(admitted_drafts=[2, 1, 0, 0], seq_lens_growth=1),
        _admitted_step(admitted_drafts=[2, 1, 0, 0], seq_lens_growth=2, batch_dtypes={"idx_mapping": "int32"}),
    ],
)
ALL += [DECODE_LOOP_ADMITTED]
BY_ID = {case.case_id: case for case in ALL}
# Owner rule owner_table (CL-OWNER-TABLE), under the first bundled profile with that rule. Rank 0 owns
# position 3, rank 1 positions 1 and 4, rank 2 positions 0 and 2: neither the slots (all 0 mod 3) nor the
# positions (0 would be rank 0's) give these owners. Slots 4 and 7 are not in the batch and hold stale
# owners outside [0, 3): never read.
TABLE_RULES = next(rules for rules in BUNDLED_RULES.values() if rules.owner_by_table)
OWNER_TABLE = corpus_case(
    "owner-table",
    rules=TABLE_RULES,
    tp_size=3,
    slots=[9, 3, 0, 6, 12],
    num_logits_per_req=[1, 2, 1, 1, 2],
    max_num_reqs=16,
    owner_table={9: 2, 3: 1, 0: 2, 6: 0, 12: 1, 4: -1, 7: 5},
)


# Three steps on one sharder, each with the table the engine's assign left after the step before (the
# batch's entries rewritten to their positions mod 2). Step 0 owners [1, 1, 0, 0] (neither slot nor
# position mod 2); step 1, the same requests one position later, [1, 0, 1, 0] (the first table would
# give [0, 1, 1, 0]); step 2 [0, 1, 1] (the first table: [1, 1, 0]).
def _table_step(slots: list[int], num_logits_per_req: list[int], **fields) -> Case:
    return corpus_case(
        "owner-table-steps",
        rules=TABLE_RULES,
        slots=slots,
        num_logits_per_req=num_logits_per_req,
        max_num_reqs=8,
        **fields,
    )


OWNER_TABLE_STEPS = carried(
    _table_step(
        [0, 1, 2, 3],
        [1, 2, 1, 1],
        owner_table={0: 1, 1: 1, 2: 0, 3: 0},
        then=[_table_step([3, 0, 1, 2], [1, 1, 2, 1]), _table_step([1, 5, 2], [2, 1, 1])],
    )
)
ALL += [OWNER_TABLE, OWNER_TABLE_STEPS]
BY_ID = {case.case_id: case for case in ALL}
# Owner rule contiguous_ranges, under the profile of examples/profiles/vllm-ascend-contiguous-ranges.yaml
# (not bundled: whoever runs this case registers that file first). Four requests at tp 3: the balanced
# ranges give rank 0 two and ranks 1 and 2 one each; ceil-sized ones would give ranks 0 and 1 two each.
RANGES_PROFILE = "vllm-ascend-contiguous-ranges"
# The file's rules (it extends vllm-0.34 and sets the owner rule; tests/meta/test_contiguous_ranges.py holds
# them equal): the case is made before anyone registers the file.
RANGES_RULES = Rules.of(RANGES_PROFILE, {**BUNDLED_RULES["vllm-0.34"].as_dict(), "owner": "contiguous_ranges"})
CONTIGUOUS_RANGES = corpus_case(
    "contiguous-ranges", rules=RANGES_RULES, tp_size=3, slots=[7, 2, 5, 0], num_logits_per_req=[2, 1, 3, 1]
)
BY_ID[CONTIGUOUS_RANGES.case_id] = CONTIGUOUS_RANGES  # not in ALL: its profile is not bundled

# The cases at the sizes engines deploy (conformance/cases/deployment.py) at tp 2, named by their kind: not in ALL
# (every entry runs on every case of ALL), registered by id as broken/sizes.py's are.
DEPLOYED = [
    replace(case, case_id=case.case_id.rsplit("-tp", 1)[0])
    for case in deployment_cases(2, BUNDLED_RULES[DEFAULT_PROFILE])
]
