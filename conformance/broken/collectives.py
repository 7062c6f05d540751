"""Steps that talk to their peers more than the spec's sequence allows. One defect each.

Engines add a collective "to be safe" (a barrier before the exchange, an
all-reduce to agree on a size every rank already knows); mixed groups then
deadlock or mix buffers. The first two call torch.distributed on the group
of their Communicator, so they run only where it has one (``groups``).

GatherOnADuplicateGroup creates a process group, which torch's threaded
backend cannot do while ranks take turns: it is not in the in-process corpus
and runs in real multi-process worlds (tests/conformance/test_multigroup.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from shardspec.comm import TorchDistComm
from shardspec.reference import ReferenceSharder, output_preconditions


class ExtraAllReduce(ReferenceSharder):
    """INV-WIRE-SEQUENCE: agrees on the logits row count with a torch.distributed.all_reduce before the exchange."""

    def all_to_all_logits(self, logits_shard, metadata):
        rows = torch.tensor([logits_shard.shape[0]], dtype=torch.int64, device=logits_shard.device)
        dist.all_reduce(rows, op=dist.ReduceOp.MAX, group=self.comm.group)
        return super().all_to_all_logits(logits_shard, metadata)


class BarrierBeforeGather(ReferenceSharder):
    """INV-WIRE-SEQUENCE: a torch.distributed.barrier before the gather."""

    def gather_sampler_output(self, *args, **kwargs):
        dist.barrier(group=self.comm.group)
        return super().gather_sampler_output(*args, **kwargs)


class WidthAgreedOnTheWire(ReferenceSharder):
    """INV-WIRE-SEQUENCE: all-gathers each rank's local sampled width through the Communicator before the gather."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        width = 0 if local_output is None else local_output.sampled_token_ids.shape[1]
        mine = torch.tensor([width], dtype=torch.int64, device=self.device)
        widths = mine.new_empty(metadata.tp_size)
        self.comm.all_gather_into_tensor(widths, mine)
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)


class BarrierThroughTheGroupObject(ReferenceSharder):
    """INV-WIRE-SEQUENCE: a barrier issued on the process-group object itself (group.barrier().wait())."""

    def gather_sampler_output(self, *args, **kwargs):
        self.comm.group.barrier().wait()
        return super().gather_sampler_output(*args, **kwargs)


class ExtraFunctionalAllReduce(ReferenceSharder):
    """INV-WIRE-SEQUENCE: agrees on the logits row count with a functional all_reduce
    (torch.distributed._functional_collectives) before the exchange."""

    def all_to_all_logits(self, logits_shard, metadata):
        rows = torch.tensor([logits_shard.shape[0]], dtype=torch.int64, device=logits_shard.device)
        funcol.wait_tensor(funcol.all_reduce(rows, "max", self.comm.group))
        return super().all_to_all_logits(logits_shard, metadata)


class GatherOnADuplicateGroup(ReferenceSharder):
    """INV-WIRE-SEQUENCE: issues the spec's all-gathers on a group of its own, of the same ranks as the TP
    group, instead of on the TP group (a peer gathering on the TP group never meets it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        ranks = dist.get_process_group_ranks(self.comm.group)
        self._own = dist.new_group(ranks, use_local_synchronization=True)

    def gather_sampler_output(self, *args, **kwargs):
        tp_comm, self.comm = self.comm, TorchDistComm(self._own)
        try:
            return super().gather_sampler_output(*args, **kwargs)
        finally:
            self.comm = tp_comm


class BarrierOnTheDefaultGroup(ReferenceSharder):
    """INV-WIRE-SEQUENCE: a torch.distributed.barrier() without a group before the gather: on the default
    group, the whole world where an engine runs several TP groups."""

    def gather_sampler_output(self, *args, **kwargs):
        dist.barrier()
        return super().gather_sampler_output(*args, **kwargs)


class AllToAllOnTheDefaultGroup(ReferenceSharder):
    """INV-WIRE-SEQUENCE: exchanges the logits with one all_to_all_single on the default group, sending nothing
    to (zero-size splits) and receiving nothing from the ranks outside its TP group: the right values, on the
    TP group itself where the world is one TP group, but on the whole world where an engine runs several (TP
    inside data parallelism)."""

    def all_to_all_logits(self, logits_shard, metadata):
        if self.check_preconditions:  # the reference's own check, so that only the group is wrong
            output_preconditions.check_logits_shard(logits_shard, metadata, rank=self.rank)
        tp, num_local, width = metadata.tp_size, metadata.num_local_logits, logits_shard.shape[1]
        received_splits, sent_splits = [0] * dist.get_world_size(), [0] * dist.get_world_size()
        for tp_rank, world_rank in enumerate(dist.get_process_group_ranks(self.comm.group)):
            received_splits[world_rank] = num_local
            sent_splits[world_rank] = metadata.num_logits_per_rank[tp_rank]
        received = logits_shard.new_empty(tp * num_local, width)
        dist.all_to_all_single(received, logits_shard.contiguous(), received_splits, sent_splits)
        return received.view(tp, num_local, width).permute(1, 0, 2).reshape(num_local, tp * width)
