"""The worked example of SPEC.md is what the reference computes."""

from itertools import accumulate

import numpy as np
import pytest

from shardspec.comm import LoopbackComm
from shardspec.reference import ReferenceSharder
from shardspec.reference.plan import build_plan
from shardspec.spec.builders import build_input_batch
from shardspec.spec.loader import load_spec
from shardspec.spec.profiles import PROFILES, rules_of


@pytest.fixture(scope="module")
def example():
    return load_spec().example


@pytest.fixture(scope="module")
def batch(example):
    qsl = example["query_start_loc"]
    query_lens = [b - a for a, b in zip(qsl, qsl[1:], strict=False)]
    return build_input_batch(example["slots"], example["num_logits_per_req"], query_lens=query_lens)


def test_example_inputs_are_a_valid_batch(example, batch):
    assert batch.query_start_loc.tolist() == example["query_start_loc"]
    assert batch.logits_indices.tolist() == example["logits_indices"]


def test_example_plan_matches_the_reference(example, batch):
    plan = build_plan(batch.idx_mapping_np, batch.cu_num_logits_np, example["tp"], rank=0)
    assert plan.owners.tolist() == example["owners"]
    assert plan.owner_sorted_reqs.tolist() == example["owner_sorted_reqs"]
    assert plan.num_logits_per_rank.tolist() == example["num_logits_per_rank"]
    assert plan.max_num_reqs_per_rank == example["max_num_reqs_per_rank"]
    assert plan.max_num_logits_per_req == example["max_num_logits_per_req"]
    assert plan.gathered_src_indices.tolist() == example["gathered_src_indices"]


@pytest.mark.parametrize("rank", [0, 1])
def test_example_sorted_indices_and_wire_rows_match_the_reference(example, batch, rank):
    tp = example["tp"]
    # The example owns requests by slot: a profile whose owner rule is that one.
    profile = next(name for name in PROFILES if rules_of(name).owner == "slot_mod_tp")
    sharder = ReferenceSharder(64, 4, comm=LoopbackComm(rank, tp), rules=rules_of(profile))
    result = sharder.shard_sampler_inputs(batch, None)
    assert result.sorted_logits_indices.tolist() == example["sorted_logits_indices"]
    owned = np.flatnonzero(np.asarray(example["owners"]) == rank).tolist()
    assert result.local_batch.req_ids == [batch.req_ids[i] for i in owned]
    M, W = example["max_num_reqs_per_rank"], example["max_num_logits_per_req"]
    assert example["wire_sampled_rows"][rank] == owned + [None] * (M - len(owned))
    logprob_rows = [None] * (M * W)
    for j, request in enumerate(owned):
        for p in range(example["num_logits_per_req"][request]):
            logprob_rows[j * W + p] = [request, p]
    assert example["wire_logprob_rows"][rank] == logprob_rows


def test_example_splits_cover_the_owner_sorted_rows(example):
    starts = [0, *accumulate(example["num_logits_per_rank"])]
    assert starts[-1] == len(example["sorted_logits_indices"]) == sum(example["num_logits_per_req"])
