"""Upstream's partition, all-to-all and grammar tests, against the reference (profile vllm-seed: the
revision those tests come from; int32 local tensors, one bitmask row per logits row).

Each rank's shard result is computed on its own (the plan needs no
communication); the all-to-all runs every rank through LockstepGroup.
"""

import numpy as np
import pytest
import torch
from bundled import VLLM_SEED

from shardspec.comm import LockstepGroup, LoopbackComm
from shardspec.reference import ReferenceSharder
from shardspec.spec.builders import build_grammar_output, build_input_batch, build_token_logits
from shardspec.spec.profiles import rules_of

MAX_REQS, MAX_LOGITS = 64, 4


def _batch_23(seed: int):
    """23 requests on scattered slots with 0-3 draft tokens each."""
    rng = np.random.default_rng(seed)
    slots = rng.permutation(MAX_REQS)[:23]
    counts = rng.integers(1, MAX_LOGITS + 1, size=23)
    return build_input_batch(slots, counts, spec_decode=True)


def _shards(batch, tp, grammar=None):
    return [
        ReferenceSharder(
            MAX_REQS, MAX_LOGITS, comm=LoopbackComm(rank, tp), rules=rules_of(VLLM_SEED)
        ).shard_sampler_inputs(batch, grammar)
        for rank in range(tp)
    ]


def _owned(batch, tp, rank):
    return [i for i in range(batch.num_reqs) if int(batch.idx_mapping_np[i]) % tp == rank]


def _rows_of(batch, reqs):
    cu = batch.cu_num_logits_np
    return [r for i in reqs for r in range(int(cu[i]), int(cu[i + 1]))]


@pytest.mark.parametrize("tp", [2, 4, 8], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("seed", [0, 1])
def test_partition_of_23_requests(tp, seed):
    batch = _batch_23(seed)
    shards = _shards(batch, tp)
    seen = []
    for rank, (local, sorted_idx, _, meta) in enumerate(shards):
        owned = _owned(batch, tp, rank)
        rows = _rows_of(batch, owned)
        seen += owned
        assert sum(meta.num_logits_per_rank) == batch.num_logits
        assert meta.num_logits_per_rank[rank] == meta.num_local_logits == len(rows)
        assert local.req_ids == [batch.req_ids[i] for i in owned]
        assert local.idx_mapping.dtype == torch.int32
        assert local.idx_mapping.tolist() == local.idx_mapping_np.tolist() == batch.idx_mapping_np[owned].tolist()
        assert local.seq_lens.tolist() == batch.seq_lens[owned].tolist()
        assert local.logits_indices.tolist() == batch.logits_indices[rows].tolist()
        assert local.expanded_idx_mapping.tolist() == batch.expanded_idx_mapping[rows].tolist()
        assert local.expanded_local_pos.tolist() == batch.expanded_local_pos[rows].tolist()
        counts = np.diff(batch.cu_num_logits_np)[owned]
        assert local.cu_num_logits.tolist() == local.cu_num_logits_np.tolist() == [0, *np.cumsum(counts).tolist()]
        assert local.num_draft_tokens_per_req.tolist() == batch.num_draft_tokens_per_req[owned].tolist()
        assert local.num_draft_tokens == int(batch.num_draft_tokens_per_req[owned].sum())
        assert torch.equal(local.query_start_loc, batch.query_start_loc)
        start = sum(meta.num_logits_per_rank[:rank])
        assert torch.equal(sorted_idx[start : start + len(rows)], local.logits_indices)
        for name in (
            "idx_mapping",
            "cu_num_logits",
            "logits_indices",
            "expanded_idx_mapping",
            "expanded_local_pos",
            "seq_lens",
        ):
            assert getattr(local, name).data_ptr() % 16 == 0, f"rank {rank}: {name} not 16-byte aligned"
        assert meta.gathered_src_indices.data_ptr() % 16 == 0
    assert sorted(seen) == list(range(batch.num_reqs)), "ranks must cover the batch exactly once"
    for _, sorted_idx, _, _ in shards[1:]:
        assert torch.equal(sorted_idx, shards[0].sorted_logits_indices)


@pytest.mark.parametrize("tp", [2, 4], ids=lambda tp: f"tp{tp}")
def test_all_to_all_rebuilds_the_token_logits(tp):
    batch = _batch_23(seed=tp)
    shard_width = 64
    token_logits = build_token_logits(int(batch.query_start_loc[-1]), tp * shard_width, seed=tp)

    def step(comm):
        sharder = ReferenceSharder(MAX_REQS, MAX_LOGITS, comm=comm, rules=rules_of(VLLM_SEED))
        local, sorted_idx, _, meta = sharder.shard_sampler_inputs(batch, None)
        columns = slice(comm.rank * shard_width, (comm.rank + 1) * shard_width)
        full = sharder.all_to_all_logits(token_logits[sorted_idx][:, columns], meta)
        return local, full

    for rank, (local, full) in enumerate(LockstepGroup(tp).run(step)):
        assert full.shape == (local.num_logits, tp * shard_width)
        assert torch.equal(full, token_logits[local.logits_indices]), f"rank {rank}"


@pytest.mark.parametrize("tp", [2, 4], ids=lambda tp: f"tp{tp}")
def test_without_spec_decode_each_request_has_one_row(tp):
    batch = build_input_batch([5, 2, 9, 0, 7, 3, 11], [1] * 7, spec_decode=False)
    for _rank, (local, sorted_idx, _, meta) in enumerate(_shards(batch, tp)):
        assert local.num_draft_tokens_per_req is None and local.num_draft_tokens == 0
        assert local.num_logits == local.num_reqs == meta.num_local_reqs
        assert local.cu_num_logits_np.tolist() == list(range(local.num_reqs + 1))
        assert local.expanded_local_pos.tolist() == [0] * local.num_reqs
        assert sorted_idx.shape == (batch.num_reqs,)


@pytest.mark.parametrize("tp", [2, 4], ids=lambda tp: f"tp{tp}")
def test_grammar_sharding_keeps_order_and_partitions_the_bitmask(tp):
    slots, counts = [5, 2, 9, 0, 7, 3, 11, 14], [1, 3, 2, 4, 1, 2, 3, 1]
    batch = build_input_batch(slots, counts)
    # Scrambled order; no listed request is owned by the last rank (slot % tp == tp - 1 excluded).
    positions = [i for i in (6, 0, 3, 7, 1, 4) if slots[i] % tp != tp - 1]
    grammar = build_grammar_output(batch, positions, 100, seed=4)
    offsets, cursor = {}, 0
    for i in positions:
        offsets[batch.req_ids[i]] = cursor
        cursor += counts[i]
    used = []
    for rank, (_, _, local_grammar, _) in enumerate(_shards(batch, tp, grammar)):
        mine = [batch.req_ids[i] for i in positions if slots[i] % tp == rank]
        if not mine:
            assert local_grammar is None, f"rank {rank} owns no grammar request"
            continue
        assert local_grammar.structured_output_request_ids == mine
        rows = [offsets[r] + k for r in mine for k in range(counts[batch.req_ids.index(r)])]
        assert local_grammar.grammar_bitmask.dtype == torch.int32
        assert torch.equal(local_grammar.grammar_bitmask, grammar.grammar_bitmask[rows])
        used += rows
    assert sorted(used) == list(range(grammar.grammar_bitmask.shape[0])), "pieces must partition the bitmask"


def test_no_grammar_gives_no_local_grammar():
    batch = build_input_batch([0, 1, 2], [1, 1, 1])
    assert all(shard.local_grammar_output is None for shard in _shards(batch, 2))


@pytest.mark.parametrize("tp", [2, 4, 8], ids=lambda tp: f"tp{tp}")
def test_gathered_src_indices_round_trip_with_an_empty_rank(tp):
    # Rank 1 owns nothing.
    slots = [s for s in range(3 * tp) if s % tp != 1][::-1]
    batch = build_input_batch(slots, [1] * len(slots))
    shards = _shards(batch, tp)
    meta = shards[0].metadata
    assert meta.max_num_reqs_per_rank == 3 and shards[1].metadata.num_local_reqs == 0
    # What each rank would send: its own batch positions, padded with -1.
    gathered = torch.full((tp * meta.max_num_reqs_per_rank,), -1, dtype=torch.int64)
    for rank in range(tp):
        owned = _owned(batch, tp, rank)
        gathered[rank * meta.max_num_reqs_per_rank :][: len(owned)] = torch.tensor(owned, dtype=torch.int64)
    for shard in shards:
        assert shard.metadata.gathered_src_indices.dtype == torch.int64
        assert gathered[shard.metadata.gathered_src_indices].tolist() == list(range(batch.num_reqs))


def test_empty_batch_plan():
    batch = build_input_batch([], [])
    for _rank, (local, sorted_idx, grammar, meta) in enumerate(_shards(batch, 4)):
        assert local.num_reqs == 0 and local.req_ids == [] and grammar is None
        assert local.cu_num_logits_np.tolist() == [0] and sorted_idx.shape == (0,)
        assert (meta.max_num_reqs_per_rank, meta.max_num_logits_per_req) == (1, 1)
        assert meta.num_logits_per_rank == [0] * 4 and meta.gathered_src_indices.shape == (0,)
