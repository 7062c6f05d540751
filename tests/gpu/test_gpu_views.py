"""On a CUDA device, with compiled kernels: inputs given as views are read by their strides.

The ``t[::2]`` example once gave local slots [0, 2, 0] on an H200 instead of
the reference's [2, 0, 6]. Larger batches run the plan kernel over many
programs, where the cross-block prefix sums read the strided inputs too.
Skipped without a GPU.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.reference import ReferenceSharder
from shardspec.spec.builders import build_input_batch
from shardspec.spec.errors import PreconditionError
from shardspec.spec.layouts import OFFSET, STRIDED, lay_out_array, lay_out_tensor

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

VIEWED = ("idx_mapping", "seq_lens", "logits_indices", "cu_num_logits")


def _every_other(tensor: torch.Tensor) -> torch.Tensor:
    return torch.stack([tensor, tensor.roll(1)], dim=-1).flatten()[::2]


def _shards(batch, tp, rank, capacity=8):
    return [
        impl(capacity, 4, comm=LoopbackComm(rank, tp), device="cuda").shard_sampler_inputs(batch, None)
        for impl in (ReferenceSharder, ProductionSharder)
    ]


def _assert_shards_equal(expected, actual):
    local_e, local_a = expected.local_batch, actual.local_batch
    assert torch.equal(expected.sorted_logits_indices, actual.sorted_logits_indices)
    assert torch.equal(expected.metadata.gathered_src_indices, actual.metadata.gathered_src_indices)
    for name in (
        "idx_mapping",
        "seq_lens",
        "logits_indices",
        "cu_num_logits",
        "expanded_idx_mapping",
        "expanded_local_pos",
    ):
        e, a = getattr(local_e, name), getattr(local_a, name)
        assert e.dtype == a.dtype and torch.equal(e, a), name
    assert np.array_equal(local_e.cu_num_logits_np, local_a.cu_num_logits_np)


def test_every_other_element_views_give_the_reference_slots():
    batch = build_input_batch([2, 5, 0, 3, 6], [1] * 5, device="cuda")
    views = replace(batch, **{name: _every_other(getattr(batch, name)) for name in VIEWED})
    expected, actual = _shards(views, tp=2, rank=0)
    assert actual.local_batch.idx_mapping.tolist() == [2, 0, 6]
    _assert_shards_equal(expected, actual)


@pytest.mark.parametrize("layout", [STRIDED, OFFSET])
@pytest.mark.parametrize("tp, rank", [(8, 3), (4, 0)])
def test_large_batch_of_views_matches_reference(layout, tp, rank):
    rng = np.random.default_rng(tp + rank)
    num_reqs = 1000
    batch = build_input_batch(rng.permutation(1024)[:num_reqs], rng.integers(1, 5, size=num_reqs), device="cuda")
    views = replace(
        batch,
        **{name: lay_out_tensor(getattr(batch, name), layout) for name in VIEWED},
        idx_mapping_np=lay_out_array(batch.idx_mapping_np, layout),
        cu_num_logits_np=lay_out_array(batch.cu_num_logits_np, layout),
    )
    expected, actual = _shards(views, tp, rank, capacity=1024)
    _assert_shards_equal(expected, actual)


def test_device_copy_mismatch_is_rejected_when_asked_and_never_synced_by_default():
    batch = build_input_batch([2, 5, 0, 3, 6], [1, 3, 2, 1, 2], device="cuda")
    wrong = replace(batch, idx_mapping=torch.tensor([2, 5, 1, 3, 6], device="cuda"))
    with pytest.raises(PreconditionError) as caught:
        ProductionSharder(8, 4, comm=LoopbackComm(0, 2), device="cuda", check_device_copies=True).shard_sampler_inputs(
            wrong, None
        )
    assert (caught.value.precondition_id, caught.value.request) == ("PRE-HOST-DEVICE-MATCH", 2)
    sharder = ProductionSharder(8, 4, comm=LoopbackComm(0, 2), device="cuda")
    sharder.shard_sampler_inputs(batch, None)  # compiles outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        shard = sharder.shard_sampler_inputs(wrong, None)  # the spec leaves the result undefined
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()  # an out-of-bounds access would surface here
    assert shard.local_batch.num_reqs == 3
