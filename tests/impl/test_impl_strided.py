"""Inputs as engines pass them: non-contiguous and storage-offset views of every input field.

The spec lets every input tensor and array be a view with any strides and
storage offset, and requires an implementation to read it by its strides. Each
case lays one field out as a view (spec/layouts.py: the bytes around it hold
plausible wrong values) and runs a whole step of one rank; production must
return what the reference returns for contiguous inputs, as must the reference
itself for the same views.
"""

from dataclasses import replace

import pytest
import torch
from impl_steps import DEVICE, assert_same

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.reference import ReferenceSharder
from shardspec.reference.local_sampler import local_sampler_output
from shardspec.spec.builders import build_input_batch
from shardspec.spec.case import Case, build_case_inputs, local_logits_shard
from shardspec.spec.layouts import BATCH_ARRAYS, BATCH_TENSORS, OFFSET, STRIDED, lay_out_tensor

TP, RANK = 2, 0
# Rank 0 of 2 owns slots 2, 0 and 6 (batch positions 0, 2 and 4).
SLOTS = [2, 5, 0, 3, 6]
COUNTS = [1, 3, 2, 1, 2]
# A layout the spec's helpers do not make: column-major storage of a 2-D tensor.
COLUMN_MAJOR = "column-major"

OUTPUT_FIELDS = ("sampled_token_ids", "num_sampled", "num_rejected", "num_nans")
LOGPROB_FIELDS = ("logprob_token_ids", "logprobs", "selected_token_ranks")
# The local batch is an input again: the gather reads its device prefix sum.
LOCAL_BATCH_FIELDS = ("local_batch.cu_num_logits",)
MATRICES = ("grammar_bitmask", "logits_shard", "sampled_token_ids", "logprob_token_ids", "logprobs")
CASE_FIELDS = BATCH_TENSORS + BATCH_ARRAYS + ("grammar_bitmask", "logits_shard")
ALL_FIELDS = CASE_FIELDS + OUTPUT_FIELDS + LOGPROB_FIELDS + LOCAL_BATCH_FIELDS
FIELD_LAYOUTS = [
    (name, layout)
    for name in ALL_FIELDS
    for layout in (STRIDED, OFFSET) + ((COLUMN_MAJOR,) if name in MATRICES else ())
]


def _case(layouts: dict) -> Case:
    return Case(
        case_id="views",
        tp_size=TP,
        slots=SLOTS,
        num_logits_per_req=COUNTS,
        max_num_reqs=8,
        max_num_logits_per_req=4,
        grammar_positions=[3, 0, 4],
        vocab_size=40,
        seed=3,
        nan_tokens=[2, 8, 12],
        gather_num_nans=True,
        logprobs_dims=(2, 1),
        layouts=layouts,
    )


def _view(tensor: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == COLUMN_MAJOR:
        view = tensor.t().contiguous().t()
        assert not view.is_contiguous() or tensor.shape[0] <= 1 or tensor.shape[1] <= 1
        return view
    return lay_out_tensor(tensor, layout)


def _local_output(output, field: str, layout: str):
    """The sampler's output with ``field`` (an output or logprob tensor) laid out as a view."""
    if field in OUTPUT_FIELDS:
        return replace(output, **{field: _view(getattr(output, field), layout)})
    logprobs = output.logprobs_tensors._replace(**{field: _view(getattr(output.logprobs_tensors, field), layout)})
    return replace(output, logprobs_tensors=logprobs)


def _step(impl, field: str = "", layout: str = ""):
    """One rank's whole step with ``field`` laid out as ``layout`` (nothing when empty)."""
    # The case lays out its own fields in the spec's layouts; the rest are laid out here.
    case = _case({field: layout} if field in CASE_FIELDS and layout != COLUMN_MAJOR else {})
    inputs = build_case_inputs(case, DEVICE)
    if field == "grammar_bitmask" and layout == COLUMN_MAJOR:
        inputs.grammar = replace(inputs.grammar, grammar_bitmask=_view(inputs.grammar.grammar_bitmask, layout))
    sharder = impl(case.max_num_reqs, case.max_num_logits_per_req, comm=LoopbackComm(RANK, TP), device=DEVICE)
    shard = sharder.shard_sampler_inputs(inputs.batch, inputs.grammar)
    logits_shard = local_logits_shard(inputs, shard.sorted_logits_indices, case, RANK)
    if field == "logits_shard" and layout == COLUMN_MAJOR:
        logits_shard = _view(logits_shard, layout)
    full = sharder.all_to_all_logits(logits_shard, shard.metadata)
    output = local_sampler_output(case, RANK, full, shard)
    if field in OUTPUT_FIELDS + LOGPROB_FIELDS:
        output = _local_output(output, field, layout)
    local_batch = shard.local_batch
    if field in LOCAL_BATCH_FIELDS:
        local_batch = replace(local_batch, cu_num_logits=_view(local_batch.cu_num_logits, layout))
    gathered = sharder.gather_sampler_output(
        output,
        shard.metadata,
        inputs.batch,
        local_batch,
        gather_num_nans=case.gather_num_nans,
        logprobs_dims=case.logprobs_dims,
    )
    return shard, full, gathered


@pytest.fixture(scope="module")
def expected():
    """The reference's step on contiguous inputs."""
    return _step(ReferenceSharder)


def test_case_exercises_every_output():
    shard, full, gathered = _step(ReferenceSharder)
    assert shard.local_batch.idx_mapping_np.tolist() == [2, 0, 6]
    assert shard.local_grammar_output is not None and gathered.logprobs_tensors is not None
    assert gathered.num_nans is not None and int(gathered.num_nans.sum()) > 0
    assert shard.metadata.max_num_logits_per_req == 3


@pytest.mark.parametrize("field, layout", FIELD_LAYOUTS, ids=[f"{f}-{lay}" for f, lay in FIELD_LAYOUTS])
def test_view_gives_the_contiguous_result(expected, field, layout):
    for impl in (ProductionSharder, ReferenceSharder):
        actual = _step(impl, field, layout)
        for name, e, a in zip(("shard", "full_vocab_logits", "gathered"), expected, actual, strict=True):
            assert_same(e, a, f"{impl.__name__} with {field} {layout}: {name}")


def _every_other(tensor: torch.Tensor) -> torch.Tensor:
    """``t[::2]`` of a tensor twice as long whose odd elements are other requests' values."""
    doubled = torch.stack([tensor, tensor.roll(1)], dim=-1).flatten()
    return doubled[::2]


def test_every_other_element_views_regression():
    """idx_mapping, seq_lens and logits_indices as ``t[::2]``: production once read them as contiguous
    (local slots [0, 2, 0] on an H200, uninitialised memory on the CPU, instead of [2, 0, 6])."""
    batch = build_input_batch(SLOTS, [1] * len(SLOTS), device=DEVICE)
    views = replace(
        batch,
        idx_mapping=_every_other(batch.idx_mapping),
        seq_lens=_every_other(batch.seq_lens),
        logits_indices=_every_other(batch.logits_indices),
    )
    assert all(not getattr(views, name).is_contiguous() for name in ("idx_mapping", "seq_lens", "logits_indices"))
    results = {
        impl: impl(8, 4, comm=LoopbackComm(RANK, TP), device=DEVICE).shard_sampler_inputs(views, None)
        for impl in (ReferenceSharder, ProductionSharder)
    }
    assert results[ReferenceSharder].local_batch.idx_mapping.tolist() == [2, 0, 6]
    assert results[ProductionSharder].local_batch.idx_mapping.tolist() == [2, 0, 6]
    assert_same(results[ReferenceSharder], results[ProductionSharder], "shard of t[::2] views")


@pytest.mark.parametrize("check_preconditions", [True, False])
def test_non_contiguous_cu_num_logits(check_preconditions):
    """Once corrupted the heap (``free(): invalid pointer``): the plan kernel read it as contiguous."""
    batch = build_input_batch(SLOTS, COUNTS, device=DEVICE)
    views = replace(batch, cu_num_logits=_every_other(batch.cu_num_logits))
    results = [
        impl(
            8, 4, comm=LoopbackComm(RANK, TP), device=DEVICE, check_preconditions=check_preconditions
        ).shard_sampler_inputs(views, None)
        for impl in (ReferenceSharder, ProductionSharder)
    ]
    assert results[1].local_batch.cu_num_logits_np.tolist() == [0, 1, 3, 5]
    assert_same(results[0], results[1], "shard with a strided cu_num_logits")
