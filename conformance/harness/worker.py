"""One rank of a multi-process conformance run (started by :mod:`.spawn`).

``python -m shardspec.conformance.harness.worker RUN_DIR LAUNCH_FILE``. Reads the
cases (each with the rules it is judged under, as data), the jobs (an entry and
a case each) and the reference expectations from RUN_DIR, runs the jobs
listed in LAUNCH_FILE in order, and streams to
``RUN_DIR/<launch>-rank<R>.frames`` (see :mod:`.transcript`) a frame after
every step of a job, with what the implementation returned in it, and one
when the job ends. This process judges nothing: the parent does, from the
frames, in a process that never imports the implementation. A world larger
than the launch's ``tp`` holds several TP groups (blocks of ``tp``
consecutive ranks, <R> the world rank), each running every job.

After an unexpected error the group's collectives are misaligned, so the
rank writes its record and leaves the launch (the launcher relaunches for
the remaining cases). A watchdog thread ends the process when a case makes
no progress for ``case_timeout_s`` seconds, after writing where it hung. An
implementation that ends the process (``sys.exit``) is said in the job's last
frame (``exited``), whichever launcher started the rank.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import pathlib
import sys
import threading
import time
import traceback

import torch

if not torch.cuda.is_available():
    # Must precede the definition of any @triton.jit function.
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The recorder's dispatch mode imports torch._dynamo when first entered: a third of a rank's time in a launch of a
# few cases at tp 8, paid by every rank unless imported before the rank server forks them (preload).
import torch._dynamo  # noqa: E402, F401
import torch.distributed as dist  # noqa: E402

import shardspec.conformance.harness.expectations  # noqa: E402, F401  (before the fork: see preload)
from shardspec.comm import TorchDistComm  # noqa: E402
from shardspec.conformance.api import ImplChoice, load_implementation  # noqa: E402
from shardspec.conformance.harness.external import adopt_slurm_environment  # noqa: E402
from shardspec.conformance.harness.performed import performed  # noqa: E402  (takes c10d's counter before any implementation)
from shardspec.conformance.harness.progress import Progress  # noqa: E402
from shardspec.conformance.harness.rank_plan import load_plans  # noqa: E402
from shardspec.conformance.harness.rank_step import run_case_on_rank  # noqa: E402
from shardspec.conformance.harness.spawn import write_whole  # noqa: E402
from shardspec.conformance.harness.transcript import encode, write_frame  # noqa: E402
from shardspec.conformance.record import FINAL_FIELDS, STEP_OUTPUT  # noqa: E402

EXIT_HUNG = 4


class FrameWriter:
    def __init__(self, path: pathlib.Path):
        self._file = open(path, "ab")
        self._lock = threading.Lock()

    def write(self, record: dict) -> None:
        with self._lock:
            write_frame(self._file, record)  # flushed: the OS keeps it if this process dies


class Watchdog:
    """Ends the process if the armed case does not finish within ``timeout_s``; touches ``beat_path`` on
    every wake-up, so the parent sees when this thread cannot run (the rank holds the GIL, or is stopped)."""

    def __init__(self, timeout_s: float, progress, writer: FrameWriter, rank: int, beat_path: pathlib.Path):
        self.timeout_s, self.progress, self.writer, self.rank = timeout_s, progress, writer, rank
        self.beat_path = beat_path
        beat_path.touch()
        self._deadline = None
        self._extended = False
        self._job = None
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()

    def arm(self, job: int, case_id: str) -> None:
        with self._lock:
            self._job, self._deadline = (job, case_id), time.monotonic() + self.timeout_s
            self._extended = False

    def _waiting_for_peers(self) -> bool:
        return self.progress.collective is not None or self.progress.step is None

    def disarm(self) -> None:
        with self._lock:
            self._deadline = None

    def _watch(self) -> None:
        while True:
            time.sleep(0.2)
            with contextlib.suppress(OSError):
                os.utime(self.beat_path)
            with self._lock:
                expired = self._deadline is not None and time.monotonic() > self._deadline
                job, case_id = self._job or (None, None)
                if expired and self._waiting_for_peers() and not self._extended:
                    # Every rank armed at the same moment: let a rank that is stuck in its
                    # own code report first, rather than a peer that only waits for it.
                    self._deadline += max(2.0, self.timeout_s / 2)
                    self._extended, expired = True, False
            if expired:
                where = self.progress.where()
                self.writer.write(
                    {
                        "job": job,
                        "case_id": case_id,
                        "rank": self.rank,
                        "in_collective": self.progress.collective is not None,
                        "step": self.progress.step,
                        "timeout": f"rank {self.rank} made no progress for {self.timeout_s:.0f}s in {where}",
                    }
                )
                os._exit(EXIT_HUNG)


class Streamer:
    """Sends what one job's implementation does as it happens: each collective before it is issued,
    what each step returned as soon as it returns; :meth:`final` is the rest, for the job's last frame."""

    def __init__(self, writer: FrameWriter, job: int, rank: int):
        self.writer, self.job, self.rank = writer, job, rank

    def on_call(self, call) -> None:
        self.writer.write({"job": self.job, "rank": self.rank, "call": encode(call)})

    def on_step(self, step: str, run) -> None:
        part = getattr(run.outputs, STEP_OUTPUT[step]) if step in STEP_OUTPUT else None
        self.writer.write({"job": self.job, "rank": self.rank, "step": step, "part": encode(part)})

    def final(self, outputs) -> dict:
        return encode({name: getattr(outputs, name) for name in FINAL_FIELDS})


def _init_group(pg_timeout_s: float, device_kind: str, tp: int | None, backend: str):
    """(device, the group for status exchanges, the rank's TP group). ``backend``: the collectives', as the
    launch file names it (harness/launch.py's GroupStarter); ranks on fewer GPUs share them round-robin."""
    adopt_slurm_environment()
    torch.set_num_threads(1)  # as the expectations were computed, whoever started this rank
    use_cuda = device_kind == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=pg_timeout_s)
    dist.init_process_group(backend=backend, timeout=timeout)
    # Status exchanges between cases use their own group, so that they never
    # pair with a data collective of a rank that is still inside a step.
    control = dist.new_group(backend="gloo", timeout=timeout)
    return device, control, _tp_group(tp, timeout)


def _tp_group(tp: int | None, timeout):
    """The world, when it has ``tp`` ranks; in a larger world (several TP groups, as an engine runs TP
    within data parallelism), the block of ``tp`` consecutive world ranks holding this rank. Every block
    is created on every rank, in order, as ``new_group`` requires."""
    world = dist.get_world_size()
    if tp is None or world == tp:
        return dist.group.WORLD
    if world % tp:
        raise RuntimeError(f"a world of {world} ranks cannot be split into TP groups of {tp}")
    mine = None
    for start in range(0, world, tp):
        group = dist.new_group(list(range(start, start + tp)), timeout=timeout)
        if start <= dist.get_rank() < start + tp:
            mine = group
    return mine


def _all_aligned(aligned: bool, control) -> bool:
    flag = torch.tensor([0 if aligned else 1])
    try:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=control)
    except Exception:  # a peer left the launch
        return False
    return int(flag) == 0


def preload(argv: list[str]) -> None:
    """Import what the ranks need, before :mod:`.spawn` forks them: once instead of once per rank (the
    suite's modules and torch._dynamo, at the top of this module). ``argv``: the implementations of the one
    entry whose ranks this server forks."""
    for name in argv:
        load_implementation(name)


def read_jobs(run_dir: pathlib.Path) -> list[dict]:
    """The launch's jobs (their cases carry the rules they are judged under, as the judge resolved them)."""
    return json.loads((run_dir / "jobs.json").read_text())["jobs"]


def exit_status(exc: SystemExit) -> int:
    """The status ``sys.exit(code)`` ends a process with."""
    if isinstance(exc.code, int):
        return exc.code
    return 0 if exc.code is None else 1


def main(argv: list[str]) -> int:
    run_dir, launch_file = pathlib.Path(argv[0]), pathlib.Path(argv[1])
    launch = json.loads(launch_file.read_text())
    device, control, tp_group = _init_group(
        launch["pg_timeout_s"], launch.get("device", "cpu"), launch.get("tp"), launch["backend"]
    )
    world_rank = dist.get_rank()
    writer = FrameWriter(run_dir / f"{launch_file.stem}-rank{world_rank}.frames")

    jobs = read_jobs(run_dir)
    cases = torch.load(run_dir / "cases.pt", weights_only=False)
    plans = load_plans(run_dir / "plans.json")
    comm = TorchDistComm(tp_group)
    rank = comm.rank  # in the TP group: what the judge and the implementation see
    progress = Progress()
    beat_path = run_dir / f"{launch_file.stem}-rank{world_rank}.beat"
    watchdog = Watchdog(launch["case_timeout_s"], progress, writer, rank, beat_path)
    implementations: dict[str, object] = {}  # loaded once per launch
    kept: dict[str, tuple] = {}  # implementation -> (case id, its sharder), for the next step of a multi-step case
    writer.write(
        {
            "event": "ready",
            "rank": rank,
            "world_rank": world_rank,
            "world_size": dist.get_world_size(),
            "pid": os.getpid(),
            "device": str(device),
            "backend": dist.get_backend(),
        }
    )
    for index in launch["job_indices"]:
        job = jobs[index]
        case = cases[job["case"]]
        name = ImplChoice(job["impl"], job["impl_odd"]).for_rank(rank)
        if name not in implementations:
            implementations[name] = load_implementation(name)
        impl = implementations[name]
        watchdog.arm(index, case.case_id)
        progress.enter(case_id=case.case_id)
        try:
            streamer = Streamer(writer, index, rank)
            previous_id, sharder = kept.pop(name, (None, None))
            record, sharder = run_case_on_rank(
                case,
                comm,
                impl.name,
                impl.factory,
                plans[job["case"]],
                device,
                progress,
                on_step=streamer.on_step,
                on_call=streamer.on_call,
                kept=sharder if case.continues and case.continues == previous_id else None,
                defer_after=True,
                counter=performed,
            )
            kept[name] = (case.case_id, sharder)
            after = record.pop("after_step")
            outputs = record["outputs"]
            record["outputs"] = streamer.final(outputs)
            # The job's last frame follows once the peers finished too (the status exchange): see below.
            record["after_step"] = "pending" if record["aligned"] else None
        except SystemExit as exc:  # the implementation ended the rank: said here, whatever launcher started it
            writer.write({"job": index, "case_id": case.case_id, "rank": rank, "exited": exit_status(exc)})
            raise
        except Exception:  # a defect of the suite itself, not of the implementation
            writer.write({"job": index, "case_id": case.case_id, "rank": rank, "harness_error": traceback.format_exc()})
            os._exit(0)
        writer.write({"job": index, **record})
        if not record["aligned"]:
            # Peers may wait in a collective this rank will never enter: leave
            # without a graceful shutdown, which could itself hang.
            after.cancel()
            os._exit(0)
        progress.enter(step="status exchange")
        peers_done = _all_aligned(True, control)
        # Every rank of the group has finished the step (or left): what the step's threads or streams wrote
        # into its inputs or result since it returned, and any collective they issued meanwhile (already
        # streamed), close the job.
        progress.enter(step="after the step")
        try:
            changed = after.finish(outputs)
        except Exception:
            writer.write({"job": index, "case_id": case.case_id, "rank": rank, "harness_error": traceback.format_exc()})
            os._exit(0)
        writer.write({"job": index, "rank": rank, "after_step": changed})
        if not peers_done:
            os._exit(0)
        watchdog.disarm()
    dist.barrier(group=control)
    dist.destroy_process_group()
    return 0


def run_rank(argv: list[str]) -> int:
    """:func:`main`, its traceback written whole where it fails (the ranks of a launch share one log)."""
    try:
        return main(argv)
    except Exception:
        write_whole(traceback.format_exc())
        return 1


if __name__ == "__main__":
    sys.exit(run_rank(sys.argv[1:]))
