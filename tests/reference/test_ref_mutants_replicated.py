"""The replicated path and the toy sampler under each profile, on inputs built so that profiles differ.

A grammar of one row per logits row and one of fixed-width blocks mask different tokens only when the
requests' row counts differ from the block width, and vllm-seed ignores admitted draft counts that
vllm-0.33 follows; these batches are laid out so each profile's rule shows in the sampled tokens. The
replicated logprobs' cu_num_generated fields are pinned with and without adaptive verification.
"""

import numpy as np
import pytest
import torch
from bundled import VLLM_033, VLLM_SEED

from shardspec.reference.sampler import replicated_output, toy_sample
from shardspec.spec.builders import build_input_batch
from shardspec.spec.model import GrammarOutput
from shardspec.spec.profiles import rules_of

VOCAB = 64


def _only_token(token: int) -> list[int]:
    """A bitmask row (two 32-bit words) that allows ``token`` alone."""
    words = [0, 0]
    words[token // 32] = 1 << (token % 32)
    return words


def _grammar(tokens_per_row: list[int]) -> GrammarOutput:
    return GrammarOutput(
        structured_output_request_ids=["req-0", "req-1"],
        grammar_bitmask=torch.tensor([_only_token(t) for t in tokens_per_row], dtype=torch.int32),
    )


def _two_then_one():
    """Requests of 2 and 1 logits rows (1 draft in all), logits that favour the highest token everywhere."""
    batch = build_input_batch([0, 1], [2, 1])
    logits = torch.arange(VOCAB, dtype=torch.float32).expand(3, VOCAB).contiguous()
    return batch, logits


def test_seed_grammar_masks_row_by_row():
    # Rows 0-1 belong to req-0 and row 2 to req-1; token 4 is even, so req-0's draft is accepted.
    batch, logits = _two_then_one()
    out = toy_sample(logits, batch, _grammar([4, 7, 9]), None, rules_of(VLLM_SEED))
    assert out.sampled_token_ids.tolist() == [[4, 7], [9, -1]]
    assert out.num_sampled.tolist() == [2, 1]
    assert out.num_rejected.tolist() == [0, 0]


def test_vllm_033_grammar_masks_block_by_block():
    # Three rows for two requests make blocks of 1 row: req-1's row takes block 1 (token 7), not row 2.
    batch, logits = _two_then_one()
    out = toy_sample(logits, batch, _grammar([4, 7, 9]), None, rules_of(VLLM_033))
    assert out.sampled_token_ids.tolist() == [[4, 7], [7, -1]]


def test_replicated_output_masks_in_the_given_profile():
    batch, logits = _two_then_one()
    seed = replicated_output(
        logits, batch, _grammar([4, 7, 9]), gather_num_nans=False, logprobs_dims=None, rules=rules_of(VLLM_SEED)
    )
    assert seed.sampled_token_ids.tolist() == [[4, 7], [9, -1]]
    blocks = replicated_output(
        logits, batch, _grammar([4, 7, 9]), gather_num_nans=False, logprobs_dims=None, rules=rules_of(VLLM_033)
    )
    assert blocks.sampled_token_ids.tolist() == [[4, 7], [7, -1]]


def _admitted_batch(dtypes=None):
    """Scheduled rows [3, 2]; admitted drafts [0, 1], so the device fields lay out 1 + 2 rows."""
    return build_input_batch([0, 1], [3, 2], admitted_drafts=[0, 1], dtypes=dtypes)


def test_seed_profile_samples_the_scheduled_rows_despite_admitted_counts():
    # vllm-seed has no admitted counts: the logits are the 5 scheduled rows and each request keeps them.
    batch = _admitted_batch()
    logits = torch.zeros(5, VOCAB)
    logits[[0, 1, 2, 3, 4], [2, 4, 5, 6, 8]] = 1.0
    out = replicated_output(logits, batch, None, gather_num_nans=True, logprobs_dims=None, rules=rules_of(VLLM_SEED))
    assert out.sampled_token_ids.tolist() == [[2, 4, 5], [6, 8, -1]]
    assert out.num_sampled.tolist() == [3, 2]
    assert out.num_rejected.tolist() == [0, 0]
    assert out.num_nans.tolist() == [0, 0]


def test_vllm_033_samples_the_admitted_rows():
    batch = _admitted_batch()
    logits = torch.zeros(3, VOCAB)
    logits[[0, 1, 2], [3, 6, 8]] = 1.0
    out = replicated_output(logits, batch, None, gather_num_nans=True, logprobs_dims=None, rules=rules_of(VLLM_033))
    assert out.sampled_token_ids.tolist() == [[3, -1], [6, 8]]
    assert out.num_sampled.tolist() == [1, 2]


def test_logprobs_list_the_scheduled_prefix_sums_without_adaptive_verification():
    batch = _admitted_batch()
    out = replicated_output(torch.randn(3, VOCAB), batch, None, gather_num_nans=False, logprobs_dims=(2, 0))
    lp = out.logprobs_tensors
    assert lp.logprob_token_ids.shape == (3, 3) and lp.logprob_token_ids.dtype == torch.int64
    assert lp.cu_num_generated_tokens == [0, 3, 5]
    assert all(type(c) is int for c in lp.cu_num_generated_tokens)
    assert lp.cu_num_generated_tokens_tensor is None


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_adaptive_verification_gives_an_int32_copy_of_the_device_cu(dtype):
    batch = _admitted_batch(dtypes={"cu_num_logits": dtype})
    out = replicated_output(
        torch.randn(3, VOCAB),
        batch,
        None,
        gather_num_nans=False,
        logprobs_dims=(2, 0),
        adaptive_verification_enabled=True,
    )
    lp = out.logprobs_tensors
    assert lp.cu_num_generated_tokens is None
    device_cu = lp.cu_num_generated_tokens_tensor
    assert device_cu.dtype == torch.int32 and device_cu.tolist() == [0, 1, 3]
    # Its own storage: the batch's device field may be reused by the engine after the step.
    assert device_cu.data_ptr() != batch.cu_num_logits.data_ptr()


def test_padded_logprob_columns_are_minus_infinity():
    batch = build_input_batch([0], [1])
    out = replicated_output(torch.randn(1, VOCAB), batch, None, gather_num_nans=False, logprobs_dims=(1, 3))
    lp = out.logprobs_tensors
    assert lp.logprobs.shape == (1, 4)
    assert torch.isneginf(lp.logprobs[:, 2:]).all()
    assert lp.logprob_token_ids[:, 2:].tolist() == [[0, 0]]
    assert np.isfinite(lp.logprobs[:, :2].numpy()).all()
