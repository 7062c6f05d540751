"""A stand-in for an engine's own batch-sharded sampler, written "upstream style".

Module-level functions, the process group kept in a state object, and
``torch.distributed`` called directly. To stay small it delegates the
planning and the gather to shardspec's reference implementation; a real
engine would have its own kernels here. It is NOT part of shardspec: it only
shows what an adapter has to bridge.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from shardspec.comm import TorchDistComm
from shardspec.reference import ReferenceSharder
from shardspec.spec.errors import PreconditionError


@dataclass
class SharderState:
    max_num_reqs: int
    max_num_logits_per_req: int
    device: torch.device
    tp_group: dist.ProcessGroup
    adaptive_verification_enabled: bool = False

    def _sharder(self) -> ReferenceSharder:
        comm = TorchDistComm(self.tp_group)
        return ReferenceSharder(
            self.max_num_reqs,
            self.max_num_logits_per_req,
            comm=comm,
            device=self.device,
            adaptive_verification_enabled=self.adaptive_verification_enabled,
        )


def shard_sampler_inputs(input_batch, grammar_output, sharder_state: SharderState):
    """-> (local_batch, sorted_logits_indices, local_grammar_output, metadata)."""
    return tuple(sharder_state._sharder().shard_sampler_inputs(input_batch, grammar_output))


def all_to_all_logits(logits_shard: torch.Tensor, metadata, sharder_state: SharderState) -> torch.Tensor:
    # PRE-LOGITS-SHARD: a shard of another row count would send other rows than the plan's, and one that is
    # not floating point other values than logits, so both are refused before the collective.
    rows = sum(metadata.num_logits_per_rank)
    if not isinstance(logits_shard, torch.Tensor) or not logits_shard.is_floating_point():
        raise PreconditionError(
            "PRE-LOGITS-SHARD",
            "logits_shard",
            f"is {getattr(logits_shard, 'dtype', type(logits_shard).__name__)}, not a floating point tensor",
        )
    if logits_shard.dim() != 2 or logits_shard.shape[0] != rows or logits_shard.shape[1] < 1:
        raise PreconditionError(
            "PRE-LOGITS-SHARD", "logits_shard", f"shape {tuple(logits_shard.shape)}; expected ({rows}, Vs)"
        )
    tp, num_local = metadata.tp_size, metadata.num_local_logits
    received = logits_shard.new_empty(tp * num_local, logits_shard.shape[-1])
    dist.all_to_all_single(
        received,
        logits_shard.contiguous(),
        output_split_sizes=[num_local] * tp,
        input_split_sizes=list(metadata.num_logits_per_rank),
        group=sharder_state.tp_group,
    )
    width = logits_shard.shape[-1]
    return received.view(tp, num_local, width).permute(1, 0, 2).reshape(num_local, tp * width)


def gather_sampler_output(
    local_output,
    metadata,
    device,
    global_batch,
    local_batch,
    gather_num_nans: bool = False,
    logprobs_dims: tuple[int, int] | None = None,
    extension_fields=None,
    *,
    sharder_state: SharderState,
):
    return sharder_state._sharder().gather_sampler_output(
        local_output,
        metadata,
        global_batch,
        local_batch,
        gather_num_nans=gather_num_nans,
        logprobs_dims=logprobs_dims,
        extension_fields=extension_fields,
    )
