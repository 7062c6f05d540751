"""The vllm-0.33 rules of profile_rules called one by one, where the sharded runs do not look closely.

A sharded run only sees whether a batch is rejected and what the gathered output holds; these pin what
each rule returns (values and dtypes) and what each of its rejections names: ID, field, request, rank
and the whole message, for every branch, including inputs that break only one side of a compound
condition.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch
from bundled import VLLM_033, VLLM_SEED

from shardspec.reference import profile_rules
from shardspec.spec.builders import build_grammar_output, build_input_batch
from shardspec.spec.errors import PreconditionError
from shardspec.spec.model import GrammarOutput
from shardspec.spec.profiles import rules_of


def _rejected(check, *args, **kwargs) -> PreconditionError:
    with pytest.raises(PreconditionError) as caught:
        check(*args, **kwargs)
    return caught.value


def _admitted_batch(admitted):
    """Scheduled drafts [2, 3, 1] (rows [3, 4, 2]); the admitted counts are replaced as given."""
    batch = build_input_batch([0, 1, 2], [3, 4, 2], admitted_drafts=[1, 1, 1])
    return replace(batch, num_admitted_draft_tokens=admitted)


# ---------------------------------------------------------------- check_admitted_drafts


def test_admitted_without_scheduled_drafts_names_the_rank():
    batch = replace(_admitted_batch(np.array([1, 1, 1])), num_draft_tokens_per_req=None)
    error = _rejected(profile_rules.check_admitted_drafts, batch, rank=1)
    assert (error.precondition_id, error.field, error.request, error.rank) == (
        "PRE-DRAFTS",
        "num_admitted_draft_tokens",
        None,
        1,
    )
    assert str(error) == (
        "[PRE-DRAFTS] is given without num_draft_tokens_per_req (field num_admitted_draft_tokens, rank 1)"
    )


@pytest.mark.parametrize(
    ("admitted", "found"),
    [
        # Integers of the wrong shape, and floats of the right shape: each breaks one side only.
        pytest.param(np.array([1, 1], dtype=np.int32), "dtype int32, shape (2,)", id="wrong-shape"),
        pytest.param(np.array([1.0, 1.0, 1.0]), "dtype float64, shape (3,)", id="wrong-dtype"),
    ],
)
def test_malformed_admitted_counts_are_named(admitted, found):
    error = _rejected(profile_rules.check_admitted_drafts, _admitted_batch(admitted), rank=2)
    assert (error.precondition_id, error.field, error.request, error.rank) == (
        "PRE-DRAFTS",
        "num_admitted_draft_tokens",
        None,
        2,
    )
    assert str(error) == (
        f"[PRE-DRAFTS] {found}: expected integers of shape (3,) (field num_admitted_draft_tokens, rank 2)"
    )


@pytest.mark.parametrize(
    "scheduled",
    [
        # Malformed scheduled counts are PRE-DRAFTS' of num_draft_tokens_per_req, not of the admitted
        # ones: the admitted check steps aside when either the shape or the dtype is off.
        pytest.param(np.array([0, 0], dtype=np.int32), id="scheduled-wrong-shape"),
        pytest.param(np.array([0.0, 0.0, 0.0]), id="scheduled-wrong-dtype"),
    ],
)
def test_admitted_check_leaves_malformed_scheduled_counts_to_the_drafts_check(scheduled):
    batch = replace(_admitted_batch(np.array([1, 1, 1], dtype=np.int32)), num_draft_tokens_per_req=scheduled)
    profile_rules.check_admitted_drafts(batch, rank=0)


def test_admitted_above_scheduled_names_request_and_rank():
    error = _rejected(profile_rules.check_admitted_drafts, _admitted_batch(np.array([2, 4, 1])), rank=3)
    assert (error.precondition_id, error.field, error.request, error.rank) == (
        "PRE-DRAFTS",
        "num_admitted_draft_tokens",
        1,
        3,
    )
    assert str(error) == (
        "[PRE-DRAFTS] 4 admitted drafts, outside [0, 3] scheduled (field num_admitted_draft_tokens, request 1, rank 3)"
    )


def test_admitted_counts_compare_exactly_beyond_float_precision():
    # 2**53 + 1 rounds to 2**53 as a float64: only an integer comparison sees it exceed 2**53.
    big = 2**53
    batch = replace(
        _admitted_batch(np.array([0, big + 1, 0], dtype=np.int64)),
        num_draft_tokens_per_req=np.array([2, big, 1], dtype=np.int64),
    )
    error = _rejected(profile_rules.check_admitted_drafts, batch)
    assert error.request == 1
    assert str(error) == (
        f"[PRE-DRAFTS] {big + 1} admitted drafts, outside [0, {big}] scheduled "
        "(field num_admitted_draft_tokens, request 1)"
    )


# ---------------------------------------------------------------- check_seq_lens_upper_bound


def test_upper_bound_that_is_no_tensor_names_its_type():
    batch = replace(build_input_batch([0, 1], [1, 1]), seq_lens_cpu_upper_bound=[9, 9])
    error = _rejected(profile_rules.check_seq_lens_upper_bound, batch, rank=1)
    assert (error.precondition_id, error.field, error.request, error.rank) == (
        "PRE-SEQ-LENS-UPPER-BOUND",
        "seq_lens_cpu_upper_bound",
        None,
        1,
    )
    assert str(error) == (
        "[PRE-SEQ-LENS-UPPER-BOUND] list, shape (): expected a CPU tensor of shape (2,) "
        "(field seq_lens_cpu_upper_bound, rank 1)"
    )


@pytest.mark.parametrize(
    ("bound", "found"),
    [
        # Off the CPU with the right shape, and on the CPU with the wrong one: each fails one side only.
        pytest.param(torch.zeros(2, dtype=torch.int32, device="meta"), "meta, shape (2,)", id="not-on-cpu"),
        pytest.param(torch.zeros(3, dtype=torch.int32), "cpu, shape (3,)", id="wrong-shape"),
    ],
)
def test_misplaced_or_misshapen_upper_bound_is_named(bound, found):
    batch = replace(build_input_batch([0, 1], [1, 1]), seq_lens_cpu_upper_bound=bound)
    error = _rejected(profile_rules.check_seq_lens_upper_bound, batch, rank=0)
    assert str(error) == (
        f"[PRE-SEQ-LENS-UPPER-BOUND] {found}: expected a CPU tensor of shape (2,) "
        "(field seq_lens_cpu_upper_bound, rank 0)"
    )


# ---------------------------------------------------------------- check_grammar_blocks


def test_acceptable_draft_counts_of_another_length_are_named():
    batch = build_input_batch([0, 1], [2, 2], admitted_drafts=[1, 1])
    grammar = build_grammar_output(batch, [0, 1], 64, block_rows=2, num_acceptable_drafts=[1])
    error = _rejected(profile_rules.check_grammar_blocks, grammar, batch, rank=1)
    assert (error.precondition_id, error.field, error.request, error.rank) == (
        "PRE-GRAMMAR-BITMASK",
        "num_acceptable_drafts",
        None,
        1,
    )
    assert str(error) == "[PRE-GRAMMAR-BITMASK] 1 entries for 2 listed requests (field num_acceptable_drafts, rank 1)"


@pytest.mark.parametrize(
    "bitmask",
    [
        pytest.param(torch.zeros(2, dtype=torch.int32), id="one-dim"),
        # Rows (but no words) while no request is listed: the row count, not the width, is wrong.
        pytest.param(torch.zeros(2, 0, dtype=torch.int32), id="rows-for-no-request"),
    ],
)
def test_bitmask_of_the_wrong_shape_is_named(bitmask):
    batch = build_input_batch([0, 1], [1, 1])
    grammar = GrammarOutput(structured_output_request_ids=[], grammar_bitmask=bitmask)
    error = _rejected(profile_rules.check_grammar_blocks, grammar, batch, rank=2)
    assert (error.precondition_id, error.field, error.request, error.rank) == (
        "PRE-GRAMMAR-BITMASK",
        "grammar_bitmask",
        None,
        2,
    )
    shape = tuple(bitmask.shape)
    assert str(error) == f"[PRE-GRAMMAR-BITMASK] shape {shape}: expected [G * S, B] (field grammar_bitmask, rank 2)"


def test_empty_bitmask_listing_no_request_is_accepted():
    # No rows but some words per row: only the rows must be 0 when no request is listed.
    batch = build_input_batch([0, 1], [1, 1])
    grammar = GrammarOutput(structured_output_request_ids=[], grammar_bitmask=torch.zeros(0, 4, dtype=torch.int32))
    profile_rules.check_grammar_blocks(grammar, batch, rank=0)


def test_rows_not_a_whole_number_of_blocks_are_named():
    batch = build_input_batch([0, 1], [1, 1])
    grammar = GrammarOutput(
        structured_output_request_ids=["req-0", "req-1"], grammar_bitmask=torch.zeros(3, 2, dtype=torch.int32)
    )
    error = _rejected(profile_rules.check_grammar_blocks, grammar, batch, rank=1)
    assert (error.field, error.request, error.rank) == ("grammar_bitmask", None, 1)
    assert str(error) == (
        "[PRE-GRAMMAR-BITMASK] 3 rows are not a block per each of 2 listed requests (field grammar_bitmask, rank 1)"
    )


def test_block_narrower_than_a_request_names_it():
    batch = build_input_batch([0, 1, 2], [1, 3, 1])
    grammar = build_grammar_output(batch, [2, 1], 64, block_rows=2)
    error = _rejected(profile_rules.check_grammar_blocks, grammar, batch, rank=3)
    assert (error.precondition_id, error.field, error.request, error.rank) == (
        "PRE-GRAMMAR-BITMASK",
        "grammar_bitmask",
        1,
        3,
    )
    assert str(error) == (
        "[PRE-GRAMMAR-BITMASK] blocks of 2 rows, but request 'req-1' has 3 logits rows "
        "(field grammar_bitmask, request 1, rank 3)"
    )


# ---------------------------------------------------------------- what the rules return


def test_device_cu_num_logits_is_int64_in_both_profiles():
    batch = build_input_batch([0, 1], [2, 3], admitted_drafts=[0, 2])
    assert batch.cu_num_logits_np.dtype == np.int32
    seed = profile_rules.device_cu_num_logits(batch, rules_of(VLLM_SEED))
    assert seed.dtype == np.int64 and seed.tolist() == [0, 2, 5]
    admitted = profile_rules.device_cu_num_logits(batch, rules_of(VLLM_033))
    assert admitted.dtype == np.int64 and admitted.tolist() == [0, 1, 4]


def test_local_draft_count_without_admitted_follows_num_draft_tokens():
    batch = build_input_batch([0, 1, 2], [2, 3, 1])
    local = np.array([0, 1])
    assert profile_rules.local_num_draft_tokens(batch, local, rules_of(VLLM_033)) == 3
    assert profile_rules.local_num_draft_tokens(batch, local, rules_of(VLLM_SEED)) == 3
    # vllm-0.33 counts the owned drafts only while the batch's num_draft_tokens is above 0 (CL-LOCAL-DRAFT-COUNT);
    # vllm-seed sums them regardless.
    none_counted = replace(batch, num_draft_tokens=0)
    assert profile_rules.local_num_draft_tokens(none_counted, local, rules_of(VLLM_033)) == 0
    assert profile_rules.local_num_draft_tokens(none_counted, local, rules_of(VLLM_SEED)) == 3


def test_local_draft_count_of_all_zero_drafts_is_zero():
    batch = build_input_batch([0, 1], [1, 1], spec_decode=True)
    assert batch.num_draft_tokens == 0 and batch.num_draft_tokens_per_req.tolist() == [0, 0]
    assert profile_rules.local_num_draft_tokens(batch, np.array([0, 1]), rules_of(VLLM_033)) == 0


def test_local_draft_count_with_admitted_counts_sums_the_owned_admitted():
    batch = build_input_batch([0, 1, 2], [3, 4, 2], admitted_drafts=[0, 2, 1])
    assert profile_rules.local_num_draft_tokens(batch, np.array([1, 2]), rules_of(VLLM_033)) == 3
    assert profile_rules.local_num_draft_tokens(batch, np.array([1, 2]), rules_of(VLLM_SEED)) == 4


def test_expected_num_draft_tokens_sums_admitted_else_scheduled():
    batch = build_input_batch([0, 1, 2], [3, 4, 2], admitted_drafts=[0, 2, 1])
    assert profile_rules.expected_num_draft_tokens(batch) == 3
    assert profile_rules.expected_num_draft_tokens(replace(batch, num_admitted_draft_tokens=None)) == 6


@pytest.mark.parametrize("profile", [VLLM_SEED, VLLM_033])
def test_gathered_cu_num_generated_lists_the_prefix_sums(profile):
    batch = build_input_batch([0, 1], [2, 3])
    out = profile_rules.gathered_cu_num_generated(batch, False, rules_of(profile))
    assert out["cu_num_generated_tokens"] == [0, 2, 5]
    assert all(type(c) is int for c in out["cu_num_generated_tokens"])
    assert set(out) == ({"cu_num_generated_tokens"} if profile == VLLM_SEED else set(LOGPROB_CU_KEYS))


LOGPROB_CU_KEYS = ("cu_num_generated_tokens", "cu_num_generated_tokens_tensor")


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_adaptive_device_cu_is_an_int32_copy(dtype):
    batch = build_input_batch([0, 1], [2, 3], admitted_drafts=[0, 2], dtypes={"cu_num_logits": dtype})
    out = profile_rules.gathered_cu_num_generated(batch, True, rules_of(VLLM_033))
    assert out["cu_num_generated_tokens"] is None
    device_cu = out["cu_num_generated_tokens_tensor"]
    assert device_cu.dtype == torch.int32 and device_cu.tolist() == [0, 1, 4]
    # A tensor of its own: writing the batch's copy afterwards must not change it.
    assert device_cu.data_ptr() != batch.cu_num_logits.data_ptr()
