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

import _thread
import itertools
import threading
import time

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from shardspec.comm import observed
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
        rows = _rows(logits_shard)
        helper = threading.Thread(target=lambda: dist.all_reduce(rows, group=self.comm.group))
        helper.start()
        helper.join()
        return super().all_to_all_logits(logits_shard, metadata)


class AllReduceInARawThread(ReferenceSharder):
    """INV-WIRE-SEQUENCE: agrees on the logits row count with a torch.distributed.all_reduce issued from a
    thread started below threading (_thread.start_new_thread), waited for before the exchange."""

    def all_to_all_logits(self, logits_shard, metadata):
        rows, done = _rows(logits_shard), threading.Event()

        def helper() -> None:
            try:
                dist.all_reduce(rows, group=self.comm.group)
            finally:
                done.set()

        _thread.start_new_thread(helper, ())
        done.wait()
        return super().all_to_all_logits(logits_shard, metadata)


class AllReduceAfterReturning(ReferenceSharder):
    """INV-WIRE-SEQUENCE: a thread it leaves running issues an all_reduce on the TP group a fraction of a second
    after the gather returned (every rank does, so the run does not hang; beside the reference it would)."""

    def gather_sampler_output(self, *args, **kwargs):
        gathered = super().gather_sampler_output(*args, **kwargs)
        group = self.comm.group
        _later(lambda: dist.all_reduce(torch.ones(1), group=group))
        return gathered


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


# -- an engine's own communicator (vLLM 0.34 exchanges the logits through its PyNccl communicator) -----------


class StandInPyNccl:
    """Stands in, on the CPU, for vLLM's ``PyNcclCommunicator``: a communicator of its own over the TP group's
    ranks (a gloo group built on the default store, as PyNccl holds an NCCL communicator torch.distributed
    never sees), with its methods' signatures: ``all_to_all_single(output, input, output_split_sizes,
    input_split_sizes)``, ``all_reduce(tensor)``, ``send(tensor, dst)``, ``recv(tensor, src)``."""

    def __init__(self, comm):
        self._group = private_gloo_group(comm)
        self.rank, self.world_size, self.disabled = comm.rank, comm.world_size, False

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes):
        self._group.alltoall_base(output, input, list(output_split_sizes), list(input_split_sizes)).wait()

    def all_reduce(self, tensor):
        self._group.allreduce([tensor]).wait()
        return tensor

    def send(self, tensor, dst):
        return self._group.send([tensor], dst, 0)

    def recv(self, tensor, src):
        return self._group.recv([tensor], src, 0)


class _ExchangeThroughTheEngine:
    """The sharder's Communicator, but for the all-to-all, which goes through the engine's communicator."""

    def __init__(self, comm, engine):
        self._comm, self.engine = comm, engine

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes):
        self.engine.all_to_all_single(output, input, output_split_sizes, input_split_sizes)

    def __getattr__(self, name: str):
        return getattr(self._comm, name)


class ExchangesThroughItsOwnCommunicator(ReferenceSharder):
    """Conforming, as an adapter of vLLM 0.34 is: the exchange goes through the engine's own communicator (the
    stand-in), which the adapter hands to the suite with shardspec.comm.observed; the gathers through the
    Communicator. Its calls are recorded as the spec's all-to-all, on the wire like any other."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.comm = _ExchangeThroughTheEngine(self.comm, observed(self.comm, StandInPyNccl(self.comm), "PyNccl"))


class ExtraAllReduceThroughItsOwnCommunicator(ExchangesThroughItsOwnCommunicator):
    """INV-WIRE-SEQUENCE: agrees on the logits row count with an all_reduce through the engine's own
    communicator, handed to the suite, before the exchange through it."""

    def all_to_all_logits(self, logits_shard, metadata):
        self.comm.engine.all_reduce(_rows(logits_shard))
        return super().all_to_all_logits(logits_shard, metadata)


class ExchangeBySendAndRecv(ExchangesThroughItsOwnCommunicator):
    """INV-WIRE-SEQUENCE: exchanges the logits with the engine communicator's point-to-point send and recv,
    one pair per peer, instead of its all_to_all_single (the same rows arrive, by other calls)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.comm.all_to_all_single = self._by_send_and_recv

    def _by_send_and_recv(self, output, input, output_split_sizes, input_split_sizes):
        engine, rank = self.comm.engine, self.comm.rank
        sends, receives = _offsets(input_split_sizes), _offsets(output_split_sizes)
        pending = []
        for peer in range(self.comm.world_size):
            mine = input[sends[peer] : sends[peer] + int(input_split_sizes[peer])]
            theirs = output[receives[peer] : receives[peer] + int(output_split_sizes[peer])]
            if peer == rank:
                theirs.copy_(mine)
            else:
                pending += [engine.send(mine.contiguous(), peer), engine.recv(theirs, peer)]
        for work in pending:
            work.wait()


class ExchangeNotHandedOver(ExchangesThroughItsOwnCommunicator):
    """INV-WIRE-SEQUENCE: exchanges through the engine's own communicator without handing it to the suite: its
    calls reach a process group the suite cannot attribute."""

    def __init__(self, *args, **kwargs):
        ReferenceSharder.__init__(self, *args, **kwargs)
        self.comm = _ExchangeThroughTheEngine(self.comm, StandInPyNccl(self.comm))


def _offsets(sizes) -> list[int]:
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += int(size)
    return offsets
