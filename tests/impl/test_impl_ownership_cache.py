"""Production keeps the ownership of a batch per number of requests under owner rules of batch positions
(position_mod_tp, contiguous_ranges): one sharder given batches of changing sizes, sizes repeated and
slots changed, shards each as a fresh reference sharder does."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from impl_steps import DEVICE

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.reference import ReferenceSharder
from shardspec.spec.builders import build_input_batch
from shardspec.spec.profiles import DEFAULT_PROFILE, rules_of

POSITION_RULES = rules_of(DEFAULT_PROFILE)
RANGE_RULES = replace(POSITION_RULES, owner="contiguous_ranges")
SIZES = [5, 8, 5, 3, 8, 1, 5]


@pytest.mark.parametrize("rules", [POSITION_RULES, RANGE_RULES], ids=lambda r: r.owner)
@pytest.mark.parametrize("tp,rank", [(2, 0), (2, 1), (3, 2)])
def test_steps_of_repeated_sizes_shard_as_fresh_reference_sharders(rules, tp, rank):
    rng = np.random.default_rng(tp * 10 + rank)
    comm = LoopbackComm(rank, tp)
    production = ProductionSharder(16, 2, comm=comm, device=DEVICE, rules=rules_of(rules))
    for step, size in enumerate(SIZES):
        slots = rng.permutation(16)[:size].tolist()
        batch = build_input_batch(slots, rng.integers(1, 3, size).tolist(), device=DEVICE)
        expected = ReferenceSharder(16, 2, comm=comm, device=DEVICE, rules=rules_of(rules)).shard_sampler_inputs(
            batch, None
        )
        got = production.shard_sampler_inputs(batch, None)
        where = f"step {step}, {size} requests"
        assert got.metadata.num_logits_per_rank == expected.metadata.num_logits_per_rank, where
        assert got.metadata.max_num_reqs_per_rank == expected.metadata.max_num_reqs_per_rank, where
        assert got.local_batch.req_ids == expected.local_batch.req_ids, where
        assert np.array_equal(got.local_batch.idx_mapping_np, expected.local_batch.idx_mapping_np), where
        assert torch.equal(got.metadata.gathered_src_indices.cpu(), expected.metadata.gathered_src_indices.cpu()), where
