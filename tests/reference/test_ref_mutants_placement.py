"""The reference puts what it makes on its own device, in the spec's dtypes, whatever torch's defaults are.

Engines often run with a default device set (``torch.set_default_device`` or ``with
torch.device(...)``). A tensor the reference creates without naming its device would land there:
under the ``meta`` default device such a tensor has no values, so the step either fails or returns
something off the CPU. Each rank runs alone with a LoopbackComm (every peer sends what this rank
sends), so the whole step stays in this thread, where the default device applies.
"""

import dataclasses

import pytest
import torch
from shardspec.fixtures import load_cases
from shardspec.fixtures.golden import encode_trace
from shardspec.fixtures.run import run_rank_step, run_reference_case
from shardspec.reference.sampler import replicated_output
from shardspec.spec.case import build_case_inputs

from shardspec.comm import LoopbackComm

# Placement does not depend on the group size: tp 1 and 2 cover every situation of the catalogue.
STEP_CASES = [case for case in load_cases() if case.expect_error is None and case.tp_size <= 2]


def _tensors(value, where="output"):
    """(place, tensor) for every tensor inside dataclasses, named tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        yield where, value
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            yield from _tensors(getattr(value, f.name), f"{where}.{f.name}")
    elif isinstance(value, tuple) and hasattr(value, "_fields"):
        for name in value._fields:
            yield from _tensors(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, (list, tuple)):
        for k, item in enumerate(value):
            yield from _tensors(item, f"{where}[{k}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors(item, f"{where}[{key!r}]")


def _assert_on_cpu(value, where):
    off_cpu = [(place, t.device) for place, t in _tensors(value, where) if t.device.type != "cpu"]
    assert not off_cpu, f"tensors off the CPU: {off_cpu}"


@pytest.mark.parametrize("case", STEP_CASES, ids=lambda case: case.case_id)
def test_every_rank_step_ignores_the_default_device(case):
    inputs = build_case_inputs(case)
    for rank in range(case.tp_size):
        expected = run_rank_step(LoopbackComm(rank, case.tp_size), case, inputs)
        with torch.device("meta"):
            actual = run_rank_step(LoopbackComm(rank, case.tp_size), case, inputs)
        _assert_on_cpu(actual, f"rank {rank}")
        assert encode_trace(actual, inputs) == encode_trace(expected, inputs), f"rank {rank}"


@pytest.mark.parametrize("case", STEP_CASES, ids=lambda case: case.case_id)
def test_every_rank_step_ignores_the_default_dtype(case):
    """Engines load models with torch's default dtype set (e.g. bfloat16): wire and outputs keep the spec's dtypes."""
    inputs = build_case_inputs(case)
    for rank in range(case.tp_size):
        expected = run_rank_step(LoopbackComm(rank, case.tp_size), case, inputs)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            actual = run_rank_step(LoopbackComm(rank, case.tp_size), case, inputs)
        finally:
            torch.set_default_dtype(previous)
        for (place, a), (_, e) in zip(_tensors(actual, f"rank {rank}"), _tensors(expected), strict=True):
            assert a.dtype == e.dtype, f"{place}: {a.dtype}, expected {e.dtype}"
        assert encode_trace(actual, inputs) == encode_trace(expected, inputs), f"rank {rank}"


def _assert_same_tensor(actual, expected, where):
    assert actual.dtype == expected.dtype, f"{where}: dtype {actual.dtype}, expected {expected.dtype}"
    assert torch.equal(actual, expected), f"{where}: {actual} != {expected}"


@pytest.mark.parametrize("case", [c for c in STEP_CASES if c.local_outputs == "toy"], ids=lambda case: case.case_id)
def test_replicated_path_ignores_the_default_device_and_matches_the_gathered_dtypes(case):
    """The unsharded path under a meta default device equals the sharded step, dtypes included."""
    inputs = build_case_inputs(case)
    gathered = run_reference_case(case, inputs)[0].gathered
    logits = inputs.token_logits[inputs.batch.logits_indices][:, : case.vocab_size]
    with torch.device("meta"):
        replicated = replicated_output(logits, inputs.batch, inputs.grammar, gather_num_nans=case.gather_num_nans,
                                       logprobs_dims=case.logprobs_dims)
    if replicated is None:
        assert inputs.batch.num_reqs == 0
        return
    _assert_on_cpu(replicated, "replicated")
    for name in ("num_sampled", "num_rejected", "num_nans"):
        expected, actual = getattr(gathered, name), getattr(replicated, name)
        assert (actual is None) == (expected is None), name
        if expected is not None:
            _assert_same_tensor(actual, expected, name)
    assert replicated.sampled_token_ids.dtype == gathered.sampled_token_ids.dtype
    for i, n in enumerate(gathered.num_sampled.tolist()):
        _assert_same_tensor(replicated.sampled_token_ids[i, :n], gathered.sampled_token_ids[i, :n], f"request {i}")
    assert (replicated.logprobs_tensors is None) == (gathered.logprobs_tensors is None)
    if gathered.logprobs_tensors is not None:
        for name in ("logprob_token_ids", "logprobs", "selected_token_ranks"):
            _assert_same_tensor(getattr(replicated.logprobs_tensors, name), getattr(gathered.logprobs_tensors, name),
                                name)
        assert replicated.logprobs_tensors.cu_num_generated_tokens == gathered.logprobs_tensors.cu_num_generated_tokens
