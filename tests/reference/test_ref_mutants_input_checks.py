"""check_input_batch on batches with admitted draft counts, in both profiles.

Which field the drafts rejection blames and what the device-copy rejection says depend on the profile
and on whether admitted counts are given; the rank must reach the vllm-0.33 checks too. Each test pins
the whole message of one such rejection.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch
from bundled import VLLM_033, VLLM_SEED

from shardspec.reference.preconditions import check_input_batch
from shardspec.spec.builders import build_input_batch
from shardspec.spec.errors import PreconditionError
from shardspec.spec.profiles import rules_of


def _rejected(batch, profile, rank=None) -> PreconditionError:
    with pytest.raises(PreconditionError) as caught:
        check_input_batch(batch, max_num_reqs=8, max_num_logits_per_req=8, rank=rank, rules=rules_of(profile))
    return caught.value


def _admitted_batch():
    """Scheduled rows [3, 4, 2] (drafts [2, 3, 1], 6 in all), of which [1, 2, 1] drafts are admitted."""
    return build_input_batch([0, 1, 2], [3, 4, 2], admitted_drafts=[1, 2, 1])


def test_admitted_batch_is_accepted_in_vllm_033():
    check_input_batch(_admitted_batch(), max_num_reqs=8, max_num_logits_per_req=8, rank=0, rules=rules_of(VLLM_033))


def test_seed_profile_sums_the_scheduled_drafts_even_with_admitted_counts():
    # vllm-seed knows no admitted counts: num_draft_tokens (4, the admitted sum) must match the scheduled 6.
    error = _rejected(_admitted_batch(), VLLM_SEED, rank=1)
    assert (error.precondition_id, error.field, error.rank) == ("PRE-DRAFTS", "num_draft_tokens", 1)
    assert str(error) == "[PRE-DRAFTS] is 4, but num_draft_tokens_per_req sums to 6 (field num_draft_tokens, rank 1)"


def test_vllm_033_blames_the_admitted_counts_for_a_wrong_total():
    batch = replace(_admitted_batch(), num_draft_tokens=6)
    error = _rejected(batch, VLLM_033, rank=1)
    assert (error.precondition_id, error.field, error.rank) == ("PRE-DRAFTS", "num_draft_tokens", 1)
    assert str(error) == "[PRE-DRAFTS] is 6, but num_admitted_draft_tokens sums to 4 (field num_draft_tokens, rank 1)"


def test_vllm_033_without_admitted_counts_blames_the_scheduled_drafts():
    batch = replace(build_input_batch([0, 1], [2, 3]), num_draft_tokens=1)
    error = _rejected(batch, VLLM_033, rank=0)
    assert str(error) == "[PRE-DRAFTS] is 1, but num_draft_tokens_per_req sums to 3 (field num_draft_tokens, rank 0)"


def test_admitted_counts_rejection_carries_the_rank():
    batch = replace(_admitted_batch(), num_admitted_draft_tokens=np.array([1, 9, 1], dtype=np.int32))
    error = _rejected(batch, VLLM_033, rank=3)
    assert (error.precondition_id, error.field, error.request, error.rank) == (
        "PRE-DRAFTS",
        "num_admitted_draft_tokens",
        1,
        3,
    )


def test_device_cu_of_scheduled_rows_names_the_admitted_rows():
    # The device copy must lay out the admitted rows; here it holds the scheduled ones.
    batch = _admitted_batch()
    batch = replace(batch, cu_num_logits=torch.from_numpy(batch.cu_num_logits_np.copy()))
    error = _rejected(batch, VLLM_033, rank=0)
    assert (error.precondition_id, error.field) == ("PRE-HOST-DEVICE-MATCH", "cu_num_logits")
    assert str(error) == (
        "[PRE-HOST-DEVICE-MATCH] device copy differs from cu_num_logits_np's admitted rows "
        "(field cu_num_logits, rank 0)"
    )


def test_device_cu_mismatch_without_admitted_counts_names_cu_num_logits_np():
    batch = build_input_batch([0, 1], [2, 3])
    batch = replace(batch, cu_num_logits=torch.tensor([0, 2, 4], dtype=torch.int32))
    error = _rejected(batch, VLLM_033, rank=0)
    assert str(error) == (
        "[PRE-HOST-DEVICE-MATCH] device copy differs from cu_num_logits_np (field cu_num_logits, rank 0)"
    )


@pytest.mark.parametrize("dtype", [np.float32, np.bool_])
def test_drafts_of_no_integer_dtype_are_named(dtype):
    batch = build_input_batch([0, 1], [2, 3])
    batch = replace(batch, num_draft_tokens_per_req=batch.num_draft_tokens_per_req.astype(dtype))
    error = _rejected(batch, VLLM_SEED, rank=0)
    assert (error.precondition_id, error.field) == ("PRE-DTYPES", "num_draft_tokens_per_req")
    assert str(error) == (
        f"[PRE-DTYPES] dtype {np.dtype(dtype)} is not an integer type (field num_draft_tokens_per_req, rank 0)"
    )


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int64])
def test_drafts_of_any_integer_dtype_are_accepted(dtype):
    batch = build_input_batch([0, 1], [2, 3])
    batch = replace(batch, num_draft_tokens_per_req=batch.num_draft_tokens_per_req.astype(dtype))
    check_input_batch(batch, max_num_reqs=8, max_num_logits_per_req=8, rules=rules_of(VLLM_SEED))


@pytest.mark.parametrize(("slot", "position"), [(-1, 0), (8, 1)])
def test_slot_outside_capacity_is_named_with_its_value(slot, position):
    slots = [5, 2]
    slots[position] = slot
    batch = build_input_batch(slots, [1, 1])
    error = _rejected(batch, VLLM_033, rank=2)
    assert (error.precondition_id, error.field, error.request, error.rank) == (
        "PRE-SLOT-RANGE",
        "idx_mapping",
        position,
        2,
    )
    assert str(error) == (
        f"[PRE-SLOT-RANGE] slot {slot} is outside [0, 8) (field idx_mapping, request {position}, rank 2)"
    )


def test_logits_rows_over_capacity_are_named():
    error = _rejected(build_input_batch([0, 1], [2, 9]), VLLM_SEED, rank=0)
    assert (error.precondition_id, error.request) == ("PRE-CAPACITY-LOGITS", 1)
    assert str(error) == (
        "[PRE-CAPACITY-LOGITS] request has 9 logits rows, more than the sharder's capacity "
        "max_num_logits_per_req=8 (field cu_num_logits, request 1, rank 0)"
    )


def test_request_without_logits_rows_is_named():
    batch = build_input_batch([0, 1], [2, 1])
    cu = np.array([0, 2, 2], dtype=np.int32)
    batch = replace(batch, cu_num_logits_np=cu)
    error = _rejected(batch, VLLM_SEED, rank=0)
    assert (error.precondition_id, error.request) == ("PRE-LOGITS-PER-REQ", 1)
    assert str(error) == (
        "[PRE-LOGITS-PER-REQ] request has 0 logits rows; at least 1 is required "
        "(field cu_num_logits, request 1, rank 0)"
    )
