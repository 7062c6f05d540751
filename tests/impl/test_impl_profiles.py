"""Production under each profile equals the reference: vLLM 0.33's admitted draft counts, adaptive
verification, grammar blocks, local dtypes, seq_lens_cpu_upper_bound and local draft counts, and
vllm-seed's behaviour for the same batches (spec/SPEC.md section 7).

Every case runs the whole step (shard, all-to-all, toy sampler, gather) in a lockstep group, all
ranks production and, for multi-rank cases, a mixed group too, and compares every output, dtype and
wire payload with the reference's.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch
from bundled import VLLM_033, VLLM_SEED
from impl_steps import DEVICE, all_ranks, assert_same, assert_traces_equal, mixed, run_case

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.reference import ReferenceSharder
from shardspec.spec.case import Case, build_case_inputs
from shardspec.spec.loader import spec_version
from shardspec.spec.model import PROFILES
from shardspec.spec.profiles import rules_of
from shardspec.spec.rules import Rules

SLOTS = [0, 1, 2, 3, 4, 5]
SCHEDULED = [3, 2, 4, 1, 3, 2]


def _case(case_id: str, **fields) -> Case:
    base = dict(
        case_id=case_id,
        tp_size=2,
        slots=SLOTS,
        num_logits_per_req=SCHEDULED,
        max_num_reqs=16,
        max_num_logits_per_req=4,
        logprobs_dims=(2, 0),
        nan_tokens=[1, 7],
        # vLLM 0.33's rules, which these tests spell out by hand (owners by slot, acceptable-draft counts)
        rules=rules_of(VLLM_033),
    )
    return Case(**{**base, **fields})


ALL_INT64 = {
    name: "int64" for name in ("idx_mapping", "cu_num_logits", "seq_lens", "expanded_idx_mapping", "expanded_local_pos")
}
ROW_SCORE = {"score": {"per": "logits_row", "dtype": "float32"}, "flag": {"per": "request", "dtype": "int32"}}

CASES_033 = [
    _case("admitted", admitted_drafts=[1, 0, 2, 0, 2, 1]),
    _case("admitted-budget-0", admitted_drafts=[0] * 6),
    _case("admitted-budget-0-adaptive", admitted_drafts=[0] * 6, adaptive_verification=True),
    _case("admitted-all", admitted_drafts=[2, 1, 3, 0, 2, 1], adaptive_verification=True),
    # tp 3, every slot owned by rank 0: ranks 1 and 2 own nothing.
    _case("admitted-idle-ranks", tp_size=3, slots=[0, 3, 6, 9, 12, 15], admitted_drafts=[2, 1, 0, 0, 1, 1]),
    _case("admitted-tp3-uneven", tp_size=3, slots=[5, 1, 9, 4, 0, 7], admitted_drafts=[1, 1, 3, 0, 0, 1]),
    _case("admitted-extensions", admitted_drafts=[1, 0, 2, 0, 2, 1], extensions=ROW_SCORE),
    _case("admitted-no-logprobs", admitted_drafts=[0, 1, 1, 0, 2, 0], logprobs_dims=None),
    _case("adaptive-without-admitted", adaptive_verification=True),
    _case("adaptive-decode", num_logits_per_req=[1] * 6, adaptive_verification=True),
    _case("empty-adaptive", slots=[], num_logits_per_req=[], adaptive_verification=True),
    # Per-request draft counts given, all zero: the local num_draft_tokens is 0 (CL-LOCAL-DRAFT-COUNT).
    _case("zero-drafts", num_logits_per_req=[1] * 6, spec_decode=True),
    # Grammar blocks of S rows, padding rows past each request's n_i (S > max n_i).
    _case("grammar-blocks-padding", grammar_positions=[3, 0, 5, 2], grammar_block_rows=6),
    _case("grammar-blocks-exact", grammar_positions=[2, 4], grammar_block_rows=4, num_acceptable_drafts=[3, 1]),
    _case(
        "grammar-blocks-admitted",
        grammar_positions=[4, 1, 0],
        grammar_block_rows=5,
        num_acceptable_drafts=[0, 1, 2],
        admitted_drafts=[1, 0, 2, 0, 2, 1],
    ),
    # Listed requests all on rank 1: rank 0's local grammar output is None.
    _case("grammar-other-rank", grammar_positions=[5, 1, 3], grammar_block_rows=4, num_acceptable_drafts=[1, 2, 0]),
    _case("grammar-blocks-tp3", tp_size=3, grammar_positions=[0, 1, 2, 3, 4, 5], grammar_block_rows=4),
    _case("dtypes-int64", batch_dtypes=ALL_INT64),
    _case("dtypes-int32-slots", batch_dtypes={"idx_mapping": "int32"}),
    _case("dtypes-mixed", batch_dtypes={"seq_lens": "int64", "expanded_local_pos": "int64", "idx_mapping": "int32"}),
    _case("dtypes-admitted", batch_dtypes=ALL_INT64, admitted_drafts=[1, 0, 2, 0, 2, 1], tp_size=3),
    # A dtype with no workspace region of its own: written as int32 and converted.
    _case("dtypes-int16-seq-lens", batch_dtypes={"seq_lens": "int16"}),
    _case("strided-admitted", admitted_drafts=[1, 0, 2, 0, 2, 1], layouts={"cu_num_logits": "strided"}),
]
# The same batches without vllm-0.33's inputs, under both profiles.
CASES_BOTH = [
    _case("spec"),
    _case("grammar-rows", grammar_positions=[3, 0, 5]),
    _case("dtypes-int64-both", batch_dtypes=ALL_INT64),
]


def _under(case: Case, profile: str) -> Case:
    return replace(case, case_id=f"{case.case_id}@{profile}", rules=rules_of(profile))


# vllm-0.33 builds no sharder of one rank (PRE-TP-SIZE, as vLLM 0.33.0's config): 0.33's admitted drafts at tp 1
# run under an engine's profile of 0.33's rules that builds one (construction: any_group, as vllm-seed).
ANY_GROUP_033 = Rules.of("engine-0.33-any-group", {**rules_of(VLLM_033).as_dict(), "construction": "any_group"})
ADMITTED_TP1 = _case(
    "admitted-tp1@engine-0.33-any-group",
    tp_size=1,
    admitted_drafts=[1, 0, 2, 0, 2, 1],
    gather_num_nans=False,
    rules=ANY_GROUP_033,
)

# None sets adaptive verification with an int64 cu_num_logits: there the reference's tensor is int64
# (test_adaptive_tensor_is_int32_and_a_copy_of_the_batch_prefix_sums).
PARAMS = [
    *(_under(c, VLLM_033) for c in CASES_033),
    ADMITTED_TP1,
    *(_under(c, p) for c in CASES_BOTH for p in PROFILES),
]


@pytest.mark.parametrize("case", PARAMS, ids=lambda case: case.case_id)
def test_profile_case_matches_reference(case):
    inputs = build_case_inputs(case, DEVICE)
    expected = run_case(case, all_ranks("reference"), inputs)
    assert_traces_equal(case, expected, run_case(case, all_ranks("production"), inputs))
    if case.tp_size > 1:
        assert_traces_equal(case, expected, run_case(case, mixed, inputs))


def _shard_all(case: Case, impl=ProductionSharder, **options):
    inputs = build_case_inputs(case, DEVICE)
    results = []
    for rank in range(case.tp_size):
        sharder = impl(
            case.max_num_reqs,
            case.max_num_logits_per_req,
            comm=LoopbackComm(rank, case.tp_size),
            device=DEVICE,
            rules=case.rules,
            adaptive_verification_enabled=case.adaptive_verification,
            **options,
        )
        results.append(sharder.shard_sampler_inputs(inputs.batch, inputs.grammar, **inputs.shard_kwargs))
    return inputs, results


def test_admitted_rows_drive_the_plan_and_the_local_batch():
    """n_i = 1 + admitted[i]: splits, width, owner order and the local prefix sums follow them, while
    num_draft_tokens_per_req stays the scheduled entries."""
    admitted = [1, 0, 2, 0, 2, 1]
    inputs, results = _shard_all(_case("a", admitted_drafts=admitted))
    rows = 1 + np.array(admitted)
    for rank, shard in enumerate(results):
        owned = np.flatnonzero(np.array(SLOTS) % 2 == rank)
        local = shard.local_batch
        assert shard.metadata.num_logits_per_rank == [int(rows[0::2].sum()), int(rows[1::2].sum())]
        assert shard.metadata.max_num_logits_per_req == 3
        assert local.cu_num_logits_np.tolist() == [0, *np.cumsum(rows[owned]).tolist()]
        assert local.cu_num_logits.tolist() == local.cu_num_logits_np.tolist()
        assert local.num_draft_tokens_per_req.tolist() == (np.array(SCHEDULED) - 1)[owned].tolist()
        assert local.num_draft_tokens == int(np.array(admitted)[owned].sum())
        assert local.num_admitted_draft_tokens is None
        assert shard.sorted_logits_indices.shape[0] == int(rows.sum())


def test_a_budget_of_zero_gives_one_row_per_request_and_no_local_drafts():
    _, results = _shard_all(_case("zero", tp_size=3, slots=[0, 3, 6, 9, 12, 15], admitted_drafts=[0] * 6))
    for rank, shard in enumerate(results):
        assert shard.metadata.max_num_logits_per_req == 1
        assert shard.metadata.num_logits_per_rank == [6, 0, 0]
        assert shard.local_batch.num_draft_tokens == 0
        assert shard.local_batch.num_reqs == (6 if rank == 0 else 0)


def test_gathered_logprobs_keep_the_scheduled_rows_with_the_admitted_ones_first():
    case = _under(_case("rows", admitted_drafts=[1, 0, 2, 0, 2, 1]), VLLM_033)
    traces = run_case(case, all_ranks("production"))
    lp = traces[0].gathered.logprobs_tensors
    admitted_rows = int(np.sum(1 + np.array([1, 0, 2, 0, 2, 1])))
    assert lp.logprobs.shape[0] == sum(SCHEDULED) > admitted_rows
    assert bool((lp.logprobs[admitted_rows:] == float("-inf")).all())
    assert bool((lp.logprob_token_ids[admitted_rows:] == 0).all())
    assert lp.cu_num_generated_tokens == np.cumsum([0, *SCHEDULED]).tolist()
    assert lp.cu_num_generated_tokens_tensor is None


@pytest.mark.parametrize("cu_dtype", ["int32", "int64"])
def test_adaptive_tensor_is_int32_and_a_copy_of_the_batch_prefix_sums(cu_dtype):
    """INV-CU-NUM-GENERATED: int32 [N + 1] on the sharder's device, memory of its own. The reference
    keeps the batch's dtype (its clone()); production follows the spec's int32."""
    case = _under(
        _case("adaptive", admitted_drafts=[1, 0, 2, 0, 2, 1], adaptive_verification=True),
        VLLM_033,
    )
    case = replace(case, batch_dtypes={"cu_num_logits": cu_dtype})
    inputs = build_case_inputs(case, DEVICE)
    traces = run_case(case, all_ranks("production"), inputs)
    for trace in traces:
        assert trace.shard.metadata.adaptive_verification_enabled is True
        lp = trace.gathered.logprobs_tensors
        assert lp.cu_num_generated_tokens is None
        tensor = lp.cu_num_generated_tokens_tensor
        assert tensor.dtype == torch.int32 and tensor.device.type == DEVICE.type
        assert tensor.tolist() == inputs.batch.cu_num_logits.tolist()
        assert tensor.untyped_storage().data_ptr() != inputs.batch.cu_num_logits.untyped_storage().data_ptr()


def test_seed_ignores_adaptive_verification_and_takes_no_033_field():
    case = _under(_case("seed"), VLLM_SEED)
    inputs, results = _shard_all(case)
    sharder = ProductionSharder(
        16, 4, comm=LoopbackComm(0, 2), device=DEVICE, rules=rules_of(VLLM_SEED), adaptive_verification_enabled=True
    )
    assert sharder.adaptive_verification_enabled is False
    # vllm-seed does not list them: an engine's fields, carried over unchanged (INV-LOCAL-UNLISTED-FIELDS).
    bound = torch.arange(6, dtype=torch.int32)
    batch = replace(inputs.batch, seq_lens_cpu_upper_bound=bound, num_admitted_draft_tokens=np.zeros(6, np.int32))
    local = sharder.shard_sampler_inputs(batch, None).local_batch
    assert local.seq_lens_cpu_upper_bound is bound
    assert local.num_admitted_draft_tokens is batch.num_admitted_draft_tokens
    assert local.idx_mapping.dtype == torch.int32 and not results[0].metadata.adaptive_verification_enabled


@pytest.mark.parametrize("profile", PROFILES)
def test_local_dtypes_follow_the_batch_only_where_the_rule_says_so(profile):
    case = _under(_case("dtypes", batch_dtypes=ALL_INT64), profile)
    _, results = _shard_all(case)
    local = results[1].local_batch
    expected = torch.int64 if rules_of(profile).local_dtypes == "batch" else torch.int32
    for name in ("idx_mapping", "cu_num_logits", "seq_lens", "expanded_idx_mapping", "expanded_local_pos"):
        assert getattr(local, name).dtype == expected, name
    assert local.logits_indices.dtype == torch.int64 and local.cu_num_logits_np.dtype == np.int32


def test_seq_lens_upper_bound_is_sliced_to_the_owned_requests():
    inputs, results = _shard_all(_under(_case("bound", tp_size=3, slots=[5, 1, 9, 4, 0, 7]), VLLM_033))
    bound = inputs.batch.seq_lens_cpu_upper_bound
    for rank, shard in enumerate(results):
        owned = [i for i, s in enumerate([5, 1, 9, 4, 0, 7]) if s % 3 == rank]
        local = shard.local_batch.seq_lens_cpu_upper_bound
        assert local.device.type == "cpu" and local.dtype == bound.dtype
        assert local.tolist() == bound[owned].tolist()


def test_grammar_blocks_keep_padding_rows_and_acceptable_counts_in_grammar_order():
    case = _case("blocks", grammar_positions=[5, 0, 3, 2], grammar_block_rows=6, num_acceptable_drafts=[4, 0, 1, 2])
    inputs, results = _shard_all(case)
    bitmask = inputs.grammar.grammar_bitmask
    for rank, shard in enumerate(results):
        kept = [k for k, pos in enumerate([5, 0, 3, 2]) if SLOTS[pos] % 2 == rank]
        local = shard.local_grammar_output
        assert local.structured_output_request_ids == [inputs.grammar.structured_output_request_ids[k] for k in kept]
        assert local.num_acceptable_drafts == [[4, 0, 1, 2][k] for k in kept]
        assert torch.equal(local.grammar_bitmask, torch.cat([bitmask[k * 6 : (k + 1) * 6] for k in kept]))
    without = replace(case, num_acceptable_drafts=None)
    _, results = _shard_all(without)
    assert all(shard.local_grammar_output.num_acceptable_drafts is None for shard in results)


def test_checks_off_give_the_same_admitted_plan():
    case = _under(_case("off", admitted_drafts=[1, 0, 2, 0, 2, 1], tp_size=3), VLLM_033)
    _, checked = _shard_all(case)
    _, unchecked = _shard_all(case, check_preconditions=False)
    _, reference = _shard_all(case, impl=ReferenceSharder)
    for rank in range(3):
        assert_same(reference[rank], checked[rank], f"rank {rank} checked")
        assert_same(checked[rank], unchecked[rank], f"rank {rank} unchecked")


def test_an_unknown_profile_is_refused():
    with pytest.raises(ValueError, match="unknown profile 'vllm-9'"):
        ProductionSharder(4, 2, comm=LoopbackComm(0, 1), rules=rules_of("vllm-9"))


def test_production_declares_the_spec_and_its_profiles():
    assert ProductionSharder.SPEC_VERSION == spec_version() and ProductionSharder.SPEC_RULES == {
        "owner": ("slot_mod_tp", "position_mod_tp", "owner_table", "contiguous_ranges")
    }
