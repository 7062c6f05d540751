"""Where the conformance step's local sampler puts its result, and which profile's grammar rule it samples
under.

An explicit output and its extension fields land on the given device, or on the logits' device when none
is given; the meta device tells these apart without a GPU. The toy sampler masks with the case's
profile: a grammar of one row per logits row (vllm-seed) samples other tokens than the same rows read as
fixed-width blocks (vllm-0.33) on this layout.
"""

from types import SimpleNamespace

import pytest
import torch
from bundled import VLLM_033, VLLM_SEED

from shardspec.reference.local_sampler import local_sampler_output
from shardspec.reference.sampler import toy_sample
from shardspec.spec.builders import build_input_batch
from shardspec.spec.case import Case, ExplicitLocalOutput
from shardspec.spec.model import GrammarOutput
from shardspec.spec.profiles import rules_of

VOCAB = 64
EXPLICIT = ExplicitLocalOutput(sampled_token_ids=[[5, 6], [7, 0]], num_sampled=[2, 1], num_rejected=[0, 0])
DECLARED = {"asked": {"per": "request", "dtype": "int32", "shape": []}}


def _explicit_case():
    return Case(
        "explicit",
        tp_size=1,
        slots=[0, 1],
        num_logits_per_req=[2, 1],
        vocab_size=VOCAB,
        logprobs_dims=None,
        local_outputs={0: EXPLICIT},
        extensions=DECLARED,
    )


def _shard():
    return SimpleNamespace(local_batch=build_input_batch([0, 1], [2, 1]), local_grammar_output=None)


@pytest.mark.parametrize(
    ("logits_device", "device"),
    [
        pytest.param("meta", None, id="on-the-logits-device"),
        pytest.param("cpu", "meta", id="on-the-given-device"),
    ],
)
def test_explicit_output_and_its_extensions_land_on_the_chosen_device(logits_device, device):
    logits = torch.zeros(3, VOCAB, device=logits_device)
    out = local_sampler_output(_explicit_case(), 0, logits, _shard(), device)
    assert out.sampled_token_ids.device.type == "meta"
    assert out.num_sampled.device.type == "meta"
    assert out.extensions["asked"].device.type == "meta"
    assert out.extensions["asked"].shape == (2,)


def test_rank_the_case_does_not_list_supplies_none():
    assert local_sampler_output(_explicit_case(), 1, torch.zeros(3, VOCAB), _shard()) is None


def _grammar() -> GrammarOutput:
    """Rows allowing token 4, 7 and 9 alone, for req-0 (2 logits rows) then req-1 (1 row)."""
    words = [[1 << 4, 0], [1 << 7, 0], [1 << 9, 0]]
    return GrammarOutput(["req-0", "req-1"], torch.tensor(words, dtype=torch.int32))


@pytest.mark.parametrize(("profile", "req_1_token"), [(VLLM_SEED, 9), (VLLM_033, 7)])
def test_toy_output_masks_under_the_case_profile(profile, req_1_token):
    batch = build_input_batch([0, 1], [2, 1])
    case = Case("toy", tp_size=1, slots=[0, 1], num_logits_per_req=[2, 1], vocab_size=VOCAB, rules=rules_of(profile))
    # Padding columns past the vocab would win every argmax: the local sampler must cut them off first.
    logits = torch.cat([torch.arange(VOCAB, dtype=torch.float32).expand(3, VOCAB), torch.full((3, 64), 99.0)], 1)
    shard = SimpleNamespace(local_batch=batch, local_grammar_output=_grammar())
    out = local_sampler_output(case, 0, logits, shard)
    assert out.sampled_token_ids.tolist() == [[4, 7], [req_1_token, -1]]
    expected = toy_sample(logits[:, :VOCAB], batch, _grammar(), 2, rules_of(profile))
    assert torch.equal(out.logprobs_tensors.logprob_token_ids, expected.logprobs_tensors.logprob_token_ids)
