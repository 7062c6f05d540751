"""Everything a rank does on the wire is recorded: torch.distributed's functions and the Communicator's."""

import json

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from shardspec.comm import LoopbackComm
from shardspec.conformance.harness.recording import RecordingComm
from shardspec.conformance.harness.threaded import run_torch_threads
from shardspec.conformance.harness.wire_calls import DIRECT_FUNCTIONS


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


def _functional_calls(comm):
    """Functional collectives (torch.distributed._functional_collectives): the operators they dispatch to are
    recorded, the step's own two under the spec's names, with what they send."""
    import torch.distributed._functional_collectives as funcol

    recorder = RecordingComm(comm)
    rank, group = comm.rank, comm.group
    with recorder.intercept_torch_distributed():
        funcol.all_reduce(torch.tensor([float(rank + 1)]), "sum", group).wait()
        all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
        all_gather(torch.tensor([rank, 7]), 0, group).wait()
        rows = torch.arange(4, dtype=torch.float32).reshape(2, 2) + 10 * rank
        funcol.all_to_all_single(rows, [1, 1], [1, 1], group).wait()
        funcol.all_reduce(torch.ones(1), "max", group.group_name).wait()  # the group by its name
    return [(call.kind, call.send.tolist(), call.output_shape, call.input_split_sizes) for call in recorder.calls]


def test_functional_collectives_are_recorded_once_with_what_they_sent():
    results = run_torch_threads(2, _functional_calls)
    assert not any(isinstance(r, dict) for r in results), results
    for rank, calls in enumerate(results):
        base = 10.0 * rank
        assert calls == [
            ("_c10d_functional.all_reduce", [float(rank + 1)], (1,), None),
            ("all_gather_into_tensor", [rank, 7], (4,), None),
            ("all_to_all_single", [[base, base + 1], [base + 2, base + 3]], (2, 2), [1, 1]),
            ("_c10d_functional.all_reduce", [1.0], (1,), None),
        ]


def _calls_on_the_tp_group(comm):
    recorder = RecordingComm(comm)
    with recorder.intercept_torch_distributed():
        dist.barrier()  # the default group, which is the TP group here
        dist.barrier(group=comm.group)
    return [call.kind for call in recorder.calls]


def test_calls_on_the_tp_group_keep_their_plain_names():
    assert run_torch_threads(2, _calls_on_the_tp_group) == [["barrier", "barrier"]] * 2


@pytest.mark.slow
def test_calls_off_the_tp_group_and_past_the_patched_functions_are_recorded(tmp_path):
    """A gloo world of 2 processes whose TP groups are single ranks: every call keeps its group, and a
    torch.distributed function or process-group method captured before recording is still seen, the method
    as the c10d operator it dispatches; so are calls on a backend object (the TP group's, the default
    group's, one built by hand on the default store, which no group holds), a call from a thread the
    recording thread starts, and an engine's start-up outside its constructor (inside it, nothing)."""
    import os
    import subprocess
    import sys

    from harness_cases import PLUGINS

    from shardspec.conformance.harness.spawn import free_port, rank_env

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
    port = free_port()
    ranks = [
        subprocess.Popen([sys.executable, "-m", "recording_world", str(tmp_path)], env={**env, **rank_env(r, 2, port)})
        for r in range(2)
    ]
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    world = "the default group (world ranks [0, 1])"
    unknown = "a ProcessGroupGloo that no process group of torch.distributed holds (one the implementation built "
    unknown += "itself; hand an engine's own communicator to the recorder instead, see the guide)"
    for rank in range(2):
        calls = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert calls == [
            {"kind": "ProcessGroup.allreduce", "send": []},
            {"kind": "c10d.allreduce_", "send": [1.0, 1.0, 1.0]},
            {"kind": f"all_reduce on {world}", "send": [1.0]},
            {"kind": f"_c10d_functional.all_reduce on {world}", "send": [1.0]},
            {"kind": "barrier", "send": []},
            {"kind": "all_gather_into_tensor", "send": [[rank, 3]]},
            {"kind": "Backend.allreduce", "send": []},
            {"kind": f"Backend.barrier on {world}", "send": []},
            {"kind": f"Backend.allreduce on {unknown}", "send": []},
            {"kind": "ProcessGroup.allreduce on a process group torch.distributed does not know", "send": []},
            {"kind": "barrier", "send": []},  # from the helper thread
            {"kind": "barrier", "send": []},  # start-up outside a constructor
        ], calls


class _EngineCommunicator:
    """Stands in for an engine's own communicator (vLLM's PyNcclCommunicator): its methods, its attributes."""

    disabled = False

    def __init__(self):
        self.inner = RecordingComm(LoopbackComm(rank=0, world_size=1))  # what it does inside is not recorded again

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes):
        self.inner.all_to_all_single(output, input, output_split_sizes, input_split_sizes)

    def all_gather(self, output, input):
        output.copy_(input)

    def send(self, tensor, dst):
        return dst


def test_an_engine_communicator_handed_to_the_recorder_is_recorded_and_alone_it_is_itself():
    from shardspec.comm import observed, start_up

    engine = _EngineCommunicator()
    plain = LoopbackComm(rank=0, world_size=1)
    assert observed(plain, engine) is engine  # outside the suite: nothing changes
    with start_up(plain):
        pass
    recorder = RecordingComm(plain)
    seen = observed(recorder, engine, "PyNccl")
    assert seen.disabled is False  # attributes pass through
    out = torch.zeros(2, 3)
    seen.all_to_all_single(out, torch.ones(2, 3), [2], [2])
    seen.all_gather(torch.zeros(1, 2), torch.tensor([[4.0, 5.0]]))
    assert seen.send(torch.ones(1), 0) == 0
    calls = [(c.kind, c.send.tolist(), c.output_shape, c.input_split_sizes) for c in recorder.calls]
    assert calls == [
        ("all_to_all_single", [[1.0] * 3] * 2, (2, 3), [2]),
        ("all_gather_into_tensor", [[4.0, 5.0]], (1, 2), None),
        ("send (PyNccl)", [1.0], (1,), None),  # not one of the step's calls: INV-WIRE-SEQUENCE fails it
    ]
    assert engine.inner.calls and out.eq(1.0).all()
