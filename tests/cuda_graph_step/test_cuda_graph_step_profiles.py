"""The captured step under each profile: vllm-0.33's refusals (admitted draft counts, local dtypes other
than the capture batch's) and the local batch equal to the eager step's in every profile that owns
requests by slot; a profile that owns them by batch position is refused."""

import pytest
import torch
from bundled import VLLM_033, VLLM_SEED
from impl_steps import DEVICE, assert_same
from shardspec_cuda_graph import CapturedSteps

from shardspec.comm import LockstepGroup, LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.spec.builders import build_input_batch
from shardspec.spec.model import PROFILES
from shardspec.spec.profiles import rules_of

SLOTS = [0, 1, 2, 3, 4, 5]
SCHEDULED = [3, 2, 4, 1, 3, 2]


def _captured(profile, tp=2, rank=0):
    return CapturedSteps(16, 4, comm=LoopbackComm(rank, tp), vocab=8, device=DEVICE, graphs=False, profile=profile)


def test_captured_step_refuses_admitted_counts_and_other_local_dtypes_in_vllm_033():
    admitted = build_input_batch(SLOTS, SCHEDULED, admitted_drafts=[1, 0, 2, 0, 2, 1], device=DEVICE)
    with pytest.raises(ValueError, match=r"vllm-0.33: admitted draft counts \(num_admitted_draft_tokens"):
        _captured(VLLM_033).shard(admitted)
    int64 = build_input_batch(SLOTS, SCHEDULED, dtypes={"seq_lens": "int64"}, device=DEVICE)
    with pytest.raises(ValueError, match="CL-LOCAL-DTYPES.*seq_lens int64"):
        _captured(VLLM_033).shard(int64)
    # vllm-seed's local dtypes are fixed: the same batch is taken.
    assert _captured(VLLM_SEED).shard(int64).local_batch.seq_lens.dtype == torch.int32


def _eager_and_captured(comm, batch, profile):
    sharder = ProductionSharder(16, 4, comm=comm, device=DEVICE, rules=rules_of(profile))
    eager = sharder.shard_sampler_inputs(batch, None).local_batch
    plan = CapturedSteps(16, 4, comm=comm, vocab=8, device=DEVICE, graphs=False, profile=profile).shard(batch)
    return eager, plan.local_batch


# Every bundled profile whose owner rule the captured step implements (by slot or by batch position).
CAPTURED_OWNERS = ("slot_mod_tp", "position_mod_tp")
SUPPORTED = [name for name in PROFILES if rules_of(name).owner in CAPTURED_OWNERS]


def test_both_owner_rules_are_bundled():
    assert {rules_of(name).owner for name in SUPPORTED} == set(CAPTURED_OWNERS)


@pytest.mark.parametrize("profile", [name for name in PROFILES if name not in SUPPORTED])
def test_another_owner_rule_is_refused_naming_the_profile(profile):
    batch = build_input_batch(SLOTS, SCHEDULED, seq_lens_upper_bound=True, device=DEVICE)
    with pytest.raises(NotImplementedError, match=f"profile {profile}: the captured step owns requests by slot or"):
        _captured(profile).shard(batch)


@pytest.mark.parametrize("profile", SUPPORTED)
def test_captured_local_batch_equals_the_eager_one_in_each_profile(profile):
    batch = build_input_batch(SLOTS, SCHEDULED, seq_lens_upper_bound=True, device=DEVICE)
    for rank, (eager, captured) in enumerate(LockstepGroup(2, timeout_s=60).run(_eager_and_captured, batch, profile)):
        assert_same(eager, captured, f"{profile} rank {rank}")
