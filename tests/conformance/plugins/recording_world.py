"""One rank of a gloo world of 2 whose TP groups are single ranks (``[0]``, ``[1]``): the calls a rank issues
while recording, written as JSON to ``OUT_DIR/rank<R>.json``. Run by tests/conformance/test_recording.py.
Also a sharder that misbehaves in the last TP group of a world only (tests/conformance/test_multigroup.py)."""

import json
import pathlib
import sys
import threading

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.distributed_c10d as c10d

from shardspec.comm import TorchDistComm, start_up
from shardspec.conformance.harness.recording import RecordingComm

CAPTURED_ALL_REDUCE = dist.all_reduce  # taken before recording replaces the function
CAPTURED_METHOD = dist.ProcessGroup.allreduce  # and the process group's method it calls


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    groups = [dist.new_group([r]) for r in range(dist.get_world_size())]
    store = dist.PrefixStore("private/", c10d._get_default_store())
    private = dist.ProcessGroupGloo(store, rank, dist.get_world_size())
    by_hand = dist.ProcessGroup(store, rank, dist.get_world_size())
    backend = dist.ProcessGroupGloo(dist.PrefixStore("by-hand/", store), rank, dist.get_world_size())
    by_hand._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    by_hand._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    recorder = RecordingComm(TorchDistComm(groups[rank]))
    with recorder.intercept_torch_distributed():
        CAPTURED_ALL_REDUCE(torch.ones(2), group=groups[rank])  # past the patched function: the group's method
        CAPTURED_METHOD(groups[rank], [torch.ones(3)]).wait()  # past the patched method too: its c10d operator
        dist.all_reduce(torch.ones(1))  # the default group: the world, not the TP group
        funcol.all_reduce(torch.ones(1), "sum", dist.group.WORLD).wait()
        dist.barrier(group=groups[rank])  # the TP group
        recorder.all_gather_into_tensor(torch.zeros(1, 2, dtype=torch.int64), torch.tensor([[rank, 3]]))
        # below the process-group object: the TP group's backend, the default group's, one built by hand
        groups[rank]._get_backend(torch.device("cpu")).allreduce([torch.ones(1)]).wait()
        dist.group.WORLD._get_backend(torch.device("cpu")).barrier().wait()
        private.allreduce([torch.ones(1)]).wait()
        by_hand.allreduce([torch.ones(1)]).wait()  # a ProcessGroup built on the store, not registered
        # from a thread the recording thread starts, joined
        helper = threading.Thread(target=lambda: dist.barrier(group=groups[rank]))
        helper.start()
        helper.join()
        # an engine's start-up counts only inside a constructor
        with recorder.start_up():
            dist.barrier(group=groups[rank])
        recorder.progress.enter(step="construct")
        with start_up(recorder):
            dist.barrier(group=groups[rank])
            # and a thread it starts, which lives on (an engine's broadcaster), records nothing later either
            ready, go, done = threading.Event(), threading.Event(), threading.Event()

            def broadcaster() -> None:
                ready.set()
                go.wait()
                dist.barrier(group=groups[rank])
                done.set()

            threading.Thread(target=broadcaster, daemon=True).start()
            ready.wait()
        recorder.progress.enter(step=None)
        go.set()
        done.wait()
    calls = [{"kind": call.kind, "send": call.send.tolist()} for call in recorder.calls]
    (pathlib.Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(calls))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])


def _reference():
    from shardspec.reference import ReferenceSharder

    return ReferenceSharder


class ExtraAllReduceInTheLastTpGroup(_reference()):
    """An extra functional all_reduce on the TP group, issued only by the ranks of the world's last TP group
    (a defect that a run judging only the first group would pass)."""

    def all_to_all_logits(self, logits_shard, metadata):
        if dist.get_rank() >= dist.get_world_size() - self.comm.world_size:
            funcol.all_reduce(torch.ones(1), "sum", self.comm.group).wait()
        return super().all_to_all_logits(logits_shard, metadata)
