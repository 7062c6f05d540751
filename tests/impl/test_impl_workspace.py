"""One sharder, many steps: the preallocated workspace gives right, aligned results every step."""

import numpy as np
import pytest
import torch
from impl_steps import DEVICE, assert_same, random_case

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.reference import ReferenceSharder
from shardspec.reference.local_sampler import local_sampler_output
from shardspec.spec.case import build_case_inputs, local_logits_shard

ALIGNED_FIELDS = (
    "idx_mapping",
    "cu_num_logits",
    "logits_indices",
    "expanded_idx_mapping",
    "expanded_local_pos",
    "seq_lens",
)


def _step(sharder, case, inputs, rank):
    shard = sharder.shard_sampler_inputs(inputs.batch, inputs.grammar)
    full = sharder.all_to_all_logits(
        local_logits_shard(inputs, shard.sorted_logits_indices, case, rank), shard.metadata
    )
    local_output = local_sampler_output(case, rank, full, shard)
    gathered = sharder.gather_sampler_output(
        local_output,
        shard.metadata,
        inputs.batch,
        shard.local_batch,
        gather_num_nans=case.gather_num_nans,
        logprobs_dims=case.logprobs_dims,
    )
    return shard, full, gathered


@pytest.mark.parametrize("tp, rank", [(2, 1), (4, 0), (8, 3)])
def test_consecutive_steps_of_one_sharder_match_reference(tp, rank):
    """Batches grow and shrink, logprob widths change; the sharder is built once."""
    cases = [random_case(seed, tp) for seed in (11, 12, 13, 14, 15)]
    production = ProductionSharder(
        cases[0].max_num_reqs, cases[0].max_num_logits_per_req, comm=LoopbackComm(rank, tp), device=DEVICE
    )
    earlier = []
    for case in cases:
        inputs = build_case_inputs(case, DEVICE)
        reference = ReferenceSharder(
            case.max_num_reqs, case.max_num_logits_per_req, comm=LoopbackComm(rank, tp), device=DEVICE
        )
        expected, actual = _step(reference, case, inputs, rank), _step(production, case, inputs, rank)
        for name, e, a in zip(("shard", "full_vocab_logits", "gathered"), expected, actual, strict=True):
            assert_same(e, a, f"{case.case_id} {name}")
        earlier.append((expected[2], actual[2]))
    # Gathered outputs are fresh tensors: later steps left earlier ones intact.
    for k, (e, a) in enumerate(earlier):
        assert_same(e, a, f"step {k} gathered, after later steps")


def test_local_tensors_and_metadata_are_16_byte_aligned():
    case = random_case(5, 2, max_reqs=24)
    inputs = build_case_inputs(case, DEVICE)
    for rank in range(case.tp_size):
        sharder = ProductionSharder(
            case.max_num_reqs, case.max_num_logits_per_req, comm=LoopbackComm(rank, 2), device=DEVICE
        )
        shard = sharder.shard_sampler_inputs(inputs.batch, inputs.grammar)
        tensors = [getattr(shard.local_batch, name) for name in ALIGNED_FIELDS]
        tensors += [shard.metadata.gathered_src_indices, shard.sorted_logits_indices]
        assert all(t.data_ptr() % 16 == 0 for t in tensors), [t.data_ptr() % 16 for t in tensors]


def test_inputs_are_not_modified():
    case = random_case(7, 4)
    inputs = build_case_inputs(case, DEVICE)
    before = {
        name: getattr(inputs.batch, name).clone()
        for name in ("idx_mapping", "cu_num_logits", "logits_indices", "seq_lens")
    }
    slots_np = inputs.batch.idx_mapping_np.copy()
    _step(
        ProductionSharder(case.max_num_reqs, case.max_num_logits_per_req, comm=LoopbackComm(1, 4), device=DEVICE),
        case,
        inputs,
        1,
    )
    for name, value in before.items():
        assert torch.equal(getattr(inputs.batch, name), value), name
    assert np.array_equal(inputs.batch.idx_mapping_np, slots_np)


@pytest.mark.parametrize("tp, rank", [(3, 2), (8, 5)])
def test_many_small_blocks_match_reference(monkeypatch, tp, rank):
    """Tiny tiles force many programs per launch (as on a GPU), exercising the cross-block prefix sums."""
    import shardspec.impl.sharder as sharder_module

    monkeypatch.setattr(sharder_module, "_TILE_ELEMENTS", 64)
    case = random_case(40 + tp, tp, max_reqs=40)
    case.num_logits_per_req = [1 + (i * 7) % case.max_num_logits_per_req for i in range(len(case.slots))]
    case.spec_decode = True
    inputs = build_case_inputs(case, DEVICE)
    production = ProductionSharder(
        case.max_num_reqs, case.max_num_logits_per_req, comm=LoopbackComm(rank, tp), device=DEVICE
    )
    assert production._plan_block < len(case.slots)
    reference = ReferenceSharder(
        case.max_num_reqs, case.max_num_logits_per_req, comm=LoopbackComm(rank, tp), device=DEVICE
    )
    for name, e, a in zip(
        ("shard", "full", "gathered"),
        _step(reference, case, inputs, rank),
        _step(production, case, inputs, rank),
        strict=True,
    ):
        assert_same(e, a, f"{case.case_id} {name}")
