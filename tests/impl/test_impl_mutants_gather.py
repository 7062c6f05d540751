"""impl/gather.py's host side where the equivalence cases do not reach: the gather with the checks off.

With ``check_preconditions=False`` the spec leaves the outcome of a broken precondition undefined;
production still must not read what is not there. A rank that owns requests but passes no local output
(PRE-LOCAL-OUTPUT) sends rows of zeros instead of reading the missing tensors. And the gathered outputs
are allocated on the sharder's device, which on the CPU only the meta device tells apart.
"""

from types import SimpleNamespace

import pytest
import torch
from impl_steps import DEVICE

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.impl.gather import WireLaunches
from shardspec.spec.builders import build_input_batch

SLOTS, COUNTS = [2, 5, 0, 3, 6], [1, 3, 2, 1, 2]


def test_with_the_checks_off_an_owning_rank_without_local_output_sends_zero_rows():
    sharder = ProductionSharder(8, 4, comm=LoopbackComm(0, 2), device=DEVICE, check_preconditions=False)
    batch = build_input_batch(SLOTS, COUNTS, device=DEVICE)
    shard = sharder.shard_sampler_inputs(batch, None)
    assert shard.local_batch.num_reqs == 3  # slots 2, 0 and 6 are rank 0's
    gathered = sharder.gather_sampler_output(None, shard.metadata, batch, shard.local_batch)
    # LoopbackComm: every rank's rows are this rank's, so every gathered row is what it sent.
    assert torch.equal(gathered.num_sampled.cpu(), torch.zeros(5, dtype=torch.int32))
    assert torch.equal(gathered.num_rejected.cpu(), torch.zeros(5, dtype=torch.int32))
    assert not gathered.sampled_token_ids.any()


@pytest.mark.parametrize("adaptive", [False, True])
def test_gathered_outputs_are_allocated_on_the_sharder_device(adaptive):
    """``_unpack`` of a step that gathered no request (no launch): every output it allocates, the
    logprobs of the batch's rows and, under adaptive verification, cu_num_generated_tokens_tensor, is on
    the sharder's device."""
    meta = torch.device("meta")
    batch = build_input_batch(SLOTS, COUNTS)
    sharder = SimpleNamespace(device=meta, adaptive_verification_enabled=adaptive)
    metadata = SimpleNamespace(gathered_src_indices=torch.empty(0, dtype=torch.int64))
    layout = batch.cu_num_logits_np.copy()
    layout[-1] -= 2  # the last request's last two rows are drafts not admitted
    out = WireLaunches._unpack(sharder, None, {}, metadata, batch, layout, 3, 5, 2, True)
    lp = out.logprobs_tensors
    tensors = [out.sampled_token_ids, out.num_sampled, out.num_rejected, out.num_nans]
    tensors += [lp.logprob_token_ids, lp.logprobs, lp.selected_token_ranks]
    assert {t.device for t in tensors} == {meta}
    assert lp.logprob_token_ids.shape == lp.logprobs.shape == (9, 2) and lp.selected_token_ranks.shape == (9,)
    if adaptive:
        assert lp.cu_num_generated_tokens is None
        generated = lp.cu_num_generated_tokens_tensor
        assert generated.device == meta and generated.dtype == torch.int32 and generated.shape == (6,)
    else:
        assert lp.cu_num_generated_tokens == batch.cu_num_logits_np.tolist()
