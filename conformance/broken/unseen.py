"""Steps whose extra collectives or writes happen where a recorder of torch.distributed's functions does not
look: below the process-group object, on a group of the implementation's own, in a thread of its own, or
after the step returned. One defect each.

Real engines take these routes: vLLM 0.34 exchanges the logits through its own PyNccl communicator, a
sampler copies results on a side stream, a helper thread prepares the next step. Beside the reference the
first four deadlock (the reference never joins their collective); the last two hand the caller tensors that
change under it.

The entries that issue collectives run in real multi-process worlds only (tests/conformance/
test_unseen_collectives.py): torch's threaded backend cannot build a gloo group, and its ranks are threads
of one process. The two that only write run in both in-process groups too (the corpus).
"""

from __future__ import annotations

import itertools
import threading
import time

import torch

from shardspec.reference import ReferenceSharder

# How long after returning the late writers write: well within the window the suite keeps watching.
LATE_S = 0.3


def _rows(logits_shard) -> torch.Tensor:
    return torch.tensor([float(logits_shard.shape[0])], device=logits_shard.device)


class AllReduceOnTheBackend(ReferenceSharder):
    """INV-WIRE-SEQUENCE: agrees on the logits row count with an all_reduce issued on the TP group's backend
    object (comm.group._get_backend(device).allreduce), below the process-group object."""

    def all_to_all_logits(self, logits_shard, metadata):
        backend = self.comm.group._get_backend(logits_shard.device)
        backend.allreduce([_rows(logits_shard)]).wait()
        return super().all_to_all_logits(logits_shard, metadata)


_PRIVATE_GROUPS = itertools.count()


def private_gloo_group(comm):
    """A gloo process group over the TP group's ranks, built on the default group's store (under a prefix of
    its own), as an engine's own communicator is: torch.distributed does not know it."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    store = dist.PrefixStore(f"shardspec-private-{next(_PRIVATE_GROUPS)}/", c10d._get_default_store())
    return dist.ProcessGroupGloo(store, comm.rank, comm.world_size)


class AllReduceOnAPrivateGlooGroup(ReferenceSharder):
    """INV-WIRE-SEQUENCE: agrees on the logits row count with an all_reduce on a gloo group of its own,
    built on the default store (ProcessGroupGloo(PrefixStore(..., store), rank, size))."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._own = private_gloo_group(self.comm)

    def all_to_all_logits(self, logits_shard, metadata):
        self._own.allreduce([_rows(logits_shard)]).wait()
        return super().all_to_all_logits(logits_shard, metadata)


class AllReduceInAHelperThread(ReferenceSharder):
    """INV-WIRE-SEQUENCE: agrees on the logits row count with a torch.distributed.all_reduce issued from a
    thread of its own, joined before the exchange."""

    def all_to_all_logits(self, logits_shard, metadata):
        import torch.distributed as dist

        rows = _rows(logits_shard)
        helper = threading.Thread(target=lambda: dist.all_reduce(rows, group=self.comm.group))
        helper.start()
        helper.join()
        return super().all_to_all_logits(logits_shard, metadata)


class WritesItsInputAfterReturning(ReferenceSharder):
    """INV-INPUTS-UNCHANGED: a thread it leaves running zeroes the local sampler output's sampled ids (an
    input of the gather) a fraction of a second after the gather returned, as a copy on an unsynchronised
    stream would."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        gathered = super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
        if local_output is not None and local_output.sampled_token_ids.numel():
            _later(lambda: local_output.sampled_token_ids.fill_(-7))
        return gathered


class WritesItsResultAfterReturning(ReferenceSharder):
    """INV-GATHER-RESULT-STABLE: a thread it leaves running overwrites the gathered sampled ids a fraction of
    a second after the gather returned them (a copy still in flight on a side stream)."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        gathered = super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
        if gathered.sampled_token_ids.numel():
            _later(lambda: gathered.sampled_token_ids.fill_(-7))
        return gathered


def _later(write) -> None:
    def run() -> None:
        time.sleep(LATE_S)
        write()

    threading.Thread(target=run, daemon=True).start()
