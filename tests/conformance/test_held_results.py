"""A multi-step run holds every earlier gathered result and reports what a later step wrote into it."""

import torch

from shardspec.conformance.harness.held import HeldResults, shared_memory
from shardspec.spec.model import LogprobsTensors, SamplerOutput


def _result(ids, values):
    logprobs = LogprobsTensors(torch.zeros(3, 2, dtype=torch.int64), values, torch.zeros(3, dtype=torch.int64), None)
    return SamplerOutput(sampled_token_ids=ids, logprobs_tensors=logprobs)


def test_a_write_into_a_held_result_names_the_step_the_field_and_the_first_row():
    kept = HeldResults()
    ids = torch.arange(6, dtype=torch.int64).view(3, 2)
    values = torch.tensor([[0.0, float("nan")], [1.0, 2.0], [3.0, 4.0]])
    kept.hold("case.step0", _result(ids, values))
    assert kept.changed() == []
    ids[2, 1] = 99
    values[1, 0] = -1.0
    assert kept.changed() == [
        {"field": "case.step0.gathered.sampled_token_ids", "row": 2},
        {"field": "case.step0.gathered.logprobs_tensors.logprobs", "row": 1},
    ]


def test_nan_for_nan_is_no_change_and_every_held_step_is_compared():
    kept = HeldResults()
    first = torch.tensor([[float("nan"), 1.0]] * 3)
    kept.hold("case.step0", _result(torch.zeros(3, 2, dtype=torch.int64), first))
    second = _result(torch.zeros(3, 2, dtype=torch.int64), torch.zeros(3, 2))
    kept.hold("case.step1", second)
    kept.hold("case.step2", None)  # a step that returned nothing holds nothing
    first[:, 0] = float("nan")  # the same NaNs written again
    assert kept.changed() == []
    second.sampled_token_ids[0, 0] = 5
    assert kept.changed() == [{"field": "case.step1.gathered.sampled_token_ids", "row": 0}]


def test_a_result_in_an_inputs_memory_is_named_with_that_input():
    counts = torch.arange(8, dtype=torch.int32)
    local = SamplerOutput(sampled_token_ids=torch.zeros(4, 1, dtype=torch.int64), num_sampled=counts)
    workspace = torch.zeros(16, dtype=torch.int32)
    inputs = {"local_output": local, "shard": {"metadata": workspace}}
    result = SamplerOutput(
        sampled_token_ids=torch.zeros(4, 2, dtype=torch.int64),
        num_sampled=counts[2:6],  # a view at an offset is still the input's memory
        num_rejected=workspace[:4],  # the sharder's own outputs are not inputs of the caller's
        num_nans=torch.empty(0, dtype=torch.int32),
    )
    assert shared_memory("gathered", result, inputs) == [
        {"field": "gathered.num_sampled", "input": "local_output.num_sampled"}
    ]
    result.num_sampled = counts.clone()
    assert shared_memory("gathered", result, inputs) == []
