"""A conforming sharder that calls torch.distributed itself, as engines' own code does.

It ignores the Communicator's methods and passes ``group=comm.group`` to
``torch.distributed`` directly, so it runs only where ``comm`` has a group:
multi-process runs and the in-process torch-threads group.
"""

from __future__ import annotations

import torch.distributed as dist

from shardspec.reference import ReferenceSharder


class _DirectCollectives:
    def __init__(self, comm):
        self.group, self.rank, self.world_size = comm.group, comm.rank, comm.world_size

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes):
        dist.all_to_all_single(
            output,
            input,
            output_split_sizes=list(output_split_sizes),
            input_split_sizes=list(input_split_sizes),
            group=self.group,
        )

    def all_gather_into_tensor(self, output, input):
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(output, input.contiguous(), group=self.group)


class DirectDistSharder(ReferenceSharder):
    def __init__(self, max_num_reqs, max_num_logits_per_req, *, comm, device):
        if getattr(comm, "group", None) is None:
            raise RuntimeError("DirectDistSharder needs comm.group (a torch.distributed group)")
        super().__init__(max_num_reqs, max_num_logits_per_req, comm=_DirectCollectives(comm), device=device)
