"""The toy sampler where the goldens never go: ties between tokens, a grammar that lists no request.

The goldens draw logits at random, so no two tokens of a row tie and a sort that breaks ties
arbitrarily passes them. The toy sampler promises ties broken by token id, so that a row's logprobs
do not depend on which other rows share its batch; these rows are wide enough (hundreds of tokens)
that torch's unstable sort does reorder equal values.
"""

import torch

from shardspec.reference.sampler import apply_grammar_bitmask, toy_sample
from shardspec.spec.builders import build_input_batch
from shardspec.spec.model import GrammarOutput


def test_logprob_ties_are_broken_by_token_id():
    batch = build_input_batch([3, 0], [1, 1])
    logits = torch.zeros(2, 512)
    logits[0, 300] = 1.0
    logits[1, 7] = 1.0
    out = toy_sample(logits, batch, None, num_logprobs=4)
    lp = out.logprobs_tensors
    # The sampled token first, then the top 4: the maximum, then the lowest ids among the tied rest.
    assert lp.logprob_token_ids.tolist() == [[300, 300, 0, 1, 2], [7, 7, 0, 1, 2]]
    assert lp.selected_token_ranks.tolist() == [0, 0]


def test_all_tied_row_samples_the_lowest_token_id():
    batch = build_input_batch([1], [1])
    out = toy_sample(torch.full((1, 256), 0.5), batch, None, num_logprobs=3)
    assert out.sampled_token_ids.tolist() == [[0]]
    assert out.logprobs_tensors.logprob_token_ids.tolist() == [[0, 0, 1, 2]]
    expected = torch.log(torch.tensor(1 / 256))
    assert torch.allclose(out.logprobs_tensors.logprobs, expected.expand(1, 4))


def test_grammar_listing_no_request_masks_nothing():
    batch = build_input_batch([2, 5], [1, 2])
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    empty = GrammarOutput(structured_output_request_ids=[], grammar_bitmask=torch.zeros(0, 2, dtype=torch.int32))
    assert torch.equal(apply_grammar_bitmask(logits, batch, empty), logits)
