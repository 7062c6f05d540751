"""The construction rule (spec/rules.py: construction) and seq_lens_upper_bound: always, in both bundled
implementations: vllm-0.33 and vllm-0.34 refuse a group of one (PRE-TP-SIZE) and fewer slots than ranks
(PRE-CAPACITY-TP) in the constructor; the seed builds both; under vllm-0.33 and vllm-0.34 a batch without
seq_lens_cpu_upper_bound is PRE-SEQ-LENS-UPPER-BOUND."""

from dataclasses import replace

import pytest

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.reference import ReferenceSharder
from shardspec.spec.builders import build_input_batch
from shardspec.spec.errors import PreconditionError
from shardspec.spec.profiles import rules_of

SHARDERS = [ReferenceSharder, ProductionSharder]


@pytest.mark.parametrize("sharder", SHARDERS)
@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.34"])
@pytest.mark.parametrize(
    ("tp", "capacity", "expected"),
    [(1, 64, "PRE-TP-SIZE"), (2, 1, "PRE-CAPACITY-TP"), (8, 7, "PRE-CAPACITY-TP"), (1, 0, "PRE-TP-SIZE")],
)
def test_vllms_profiles_refuse_small_groups_when_built(sharder, profile, tp, capacity, expected):
    """vLLM 0.33.0's config refuses them as 0.34.0's does (VllmConfig._validate_batch_sharded_sampling)."""
    with pytest.raises(PreconditionError) as caught:
        sharder(capacity, 4, comm=LoopbackComm(0, tp), rules=rules_of(profile))
    assert caught.value.precondition_id == expected and f"[{expected}]" in str(caught.value)
    assert caught.value.rank == 0


@pytest.mark.parametrize("sharder", SHARDERS)
def test_the_seed_builds_a_group_of_one_and_one_slot_for_two_ranks(sharder):
    assert sharder(64, 4, comm=LoopbackComm(0, 1), rules=rules_of("vllm-seed")).tp_size == 1
    assert sharder(1, 4, comm=LoopbackComm(1, 2), rules=rules_of("vllm-seed")).max_num_reqs == 1


@pytest.mark.parametrize("sharder", SHARDERS)
@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.34"])
def test_vllms_profiles_build_as_many_slots_as_ranks(sharder, profile):
    assert sharder(2, 4, comm=LoopbackComm(1, 2), rules=rules_of(profile)).tp_size == 2


@pytest.mark.parametrize("sharder", SHARDERS)
@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.34"])
def test_a_batch_without_the_bound_is_refused_where_it_is_always_passed(sharder, profile):
    batch = build_input_batch([0, 1, 2], [1, 1, 1], seq_lens_upper_bound=True)
    shard = sharder(64, 4, comm=LoopbackComm(0, 2), rules=rules_of(profile))
    shard.shard_sampler_inputs(batch, None)  # with the bound: accepted
    with pytest.raises(PreconditionError, match=r"\[PRE-SEQ-LENS-UPPER-BOUND\]") as caught:
        shard.shard_sampler_inputs(replace(batch, seq_lens_cpu_upper_bound=None), None)
    assert caught.value.field == "seq_lens_cpu_upper_bound"
