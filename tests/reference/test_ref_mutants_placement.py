"""The reference puts what it makes on its own device, in the spec's dtypes, whatever torch's defaults are.

A sharder given another device than its host inputs' (meta: shapes, no values) must put there every
tensor it makes.

Engines often run with a default device set (``torch.set_default_device`` or ``with
torch.device(...)``). A tensor the reference creates without naming its device would land there:
under the ``meta`` default device such a tensor has no values, so the step either fails or returns
something off the CPU. Each rank runs alone with a LoopbackComm (every peer sends what this rank
sends), so the whole step stays in this thread, where the default device applies.
"""

import dataclasses

import pytest
import torch
from test_ref_preconditions import COUNTS, MASK, SLOTS, _output

from shardspec.comm import LoopbackComm
from shardspec.conformance.harness.expectations import replicated_of
from shardspec.fixtures import load_cases
from shardspec.fixtures.golden import encode_trace
from shardspec.fixtures.run import run_rank_step, run_reference_case
from shardspec.reference import ReferenceSharder
from shardspec.spec.builders import build_grammar_output, build_input_batch
from shardspec.spec.case import build_case_inputs

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
    with torch.device("meta"):
        replicated = replicated_of(case, inputs)
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
        rows = replicated.logprobs_tensors.logprobs.shape[0]  # the admitted rows; later ones are unspecified
        for name in ("logprob_token_ids", "logprobs", "selected_token_ranks"):
            _assert_same_tensor(
                getattr(replicated.logprobs_tensors, name), getattr(gathered.logprobs_tensors, name)[:rows], name
            )
        assert replicated.logprobs_tensors.cu_num_generated_tokens == gathered.logprobs_tensors.cu_num_generated_tokens


def _on_device(output, device: str):
    """The output with every tensor field (and logprobs tensor) moved to ``device``."""
    moved = {
        f.name: getattr(output, f.name).to(device)
        for f in dataclasses.fields(output)
        if isinstance(getattr(output, f.name), torch.Tensor)
    }
    if output.logprobs_tensors is not None:
        lp = output.logprobs_tensors
        moved["logprobs_tensors"] = lp._replace(**{name: getattr(lp, name).to(device) for name in lp._fields[:3]})
    if output.extensions:
        moved["extensions"] = {name: value.to(device) for name, value in output.extensions.items()}
    return dataclasses.replace(output, **moved)


@pytest.mark.parametrize("rank", [0, 1])
def test_every_tensor_the_step_makes_is_on_the_sharders_device(rank):
    """A sharder on another device than its host inputs (here meta, which has shapes but no values)."""
    batch = build_input_batch(SLOTS, COUNTS, seq_lens_upper_bound=True)
    grammar = build_grammar_output(batch, [2, 0], 100, block_rows=4)
    sharder = ReferenceSharder(8, 4, comm=LoopbackComm(rank, 2), device="meta")
    shard = sharder.shard_sampler_inputs(batch, grammar)
    # Views of inputs stay where the inputs are: the global query_start_loc (CL-LOCAL-FIELDS) and the
    # local rows of the grammar bitmask.
    # seq_lens_cpu_upper_bound is a host tensor by definition (CL-SEQ-LENS-UPPER-BOUND).
    kept = {
        "shard.local_batch.query_start_loc",
        "shard.local_grammar_output.grammar_bitmask",
        "shard.local_batch.seq_lens_cpu_upper_bound",
    }
    _assert_on(shard, "shard", "meta", kept)
    full = sharder.all_to_all_logits(torch.zeros(batch.num_logits, 8, device="meta"), shard.metadata)
    assert full.device.type == "meta" and full.shape == (shard.metadata.num_local_logits, 16)
    local = shard.local_batch
    mask = torch.zeros(local.num_logits, 4, dtype=torch.int32)
    output = dataclasses.replace(_output(local), extensions={"mask": mask})
    gathered = sharder.gather_sampler_output(
        _on_device(output, "meta"),
        shard.metadata,
        batch,
        local,
        gather_num_nans=True,
        logprobs_dims=(2, 0),
        extension_fields={"mask": MASK},
    )
    _assert_on(gathered, "gathered", "meta", set())


def _assert_on(value, where, device, kept):
    elsewhere = [place for place, t in _tensors(value, where) if t.device.type != device and place not in kept]
    assert not elsewhere, f"not on {device}: {elsewhere}"
