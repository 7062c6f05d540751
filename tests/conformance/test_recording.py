"""Everything a rank does on the wire is recorded: torch.distributed's functions and the Communicator's."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from shardspec.comm import LoopbackComm
from shardspec.conformance.harness.recording import DIRECT_FUNCTIONS, RecordingComm
from shardspec.conformance.harness.threaded import run_torch_threads


def _direct_calls(comm):
    """Calls a careless implementation might add, each through torch.distributed itself."""
    recorder = RecordingComm(comm)
    group = comm.group
    value = torch.tensor([float(comm.rank + 1)])
    with recorder.intercept_torch_distributed():
        dist.all_reduce(value, group=group)
        dist.broadcast(torch.tensor([7.0]), src=0, group=group)
        dist.barrier(group=group)
        gathered = [torch.zeros(2) for _ in range(comm.world_size)]
        dist.all_gather(gathered, torch.tensor([1.0, 2.0]), group=group)
        c10d.all_reduce(torch.ones(3), group=group)  # the other namespace
        out = torch.zeros(comm.world_size, 2, dtype=torch.int64)
        recorder.all_gather_into_tensor(out, torch.tensor([comm.rank, 5]))  # the Communicator's own: once
    return [(call.kind, call.send.tolist(), call.output_shape) for call in recorder.calls]


def test_every_direct_call_is_recorded_once_with_what_it_sent():
    results = run_torch_threads(2, _direct_calls)
    assert not any(isinstance(r, dict) for r in results), results
    for rank, calls in enumerate(results):
        assert calls == [
            ("all_reduce", [float(rank + 1)], (1,)),  # the send buffer as it was before the reduction
            ("broadcast", [7.0], (1,)),
            ("barrier", [], ()),
            ("all_gather", [1.0, 2.0], ()),
            ("all_reduce", [1.0, 1.0, 1.0], (3,)),
            ("all_gather_into_tensor", [rank, 5], (2, 2)),
        ]


def test_functions_are_restored_after_recording():
    originals = {name: getattr(dist, name) for name in DIRECT_FUNCTIONS if hasattr(dist, name)}
    run_torch_threads(2, _direct_calls)
    assert {name: getattr(dist, name) for name in originals} == originals


class _CommWithBarrier(LoopbackComm):
    """A richer Communicator than the protocol promises."""

    def __init__(self):
        super().__init__(rank=0, world_size=1)
        self.barriers = 0

    def barrier(self):
        self.barriers += 1


def test_communicator_methods_beyond_the_protocol_are_recorded():
    inner = _CommWithBarrier()
    recorder = RecordingComm(inner)
    recorder.barrier()
    out = torch.zeros(1, 2)
    recorder.all_to_all_single(out, torch.ones(1, 2), [1], [1])
    assert [call.kind for call in recorder.calls] == ["barrier", "all_to_all_single"]
    assert inner.barriers == 1 and recorder.world_size == 1  # plain attributes pass through unrecorded
    with pytest.raises(AttributeError):
        recorder.all_reduce  # noqa: B018 - a method the Communicator lacks stays missing
