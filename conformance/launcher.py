"""Multi-process runs: one process per rank (like ``torchrun``, see :mod:`.spawn`) over many jobs.

A job is one case run by one entry (``A`` or ``A/B``); every entry of a run
shares one launch per group size, since starting the ranks (importing torch
on every one) costs more than most cases. The parent computes the reference
expectations once per case, saves them with the cases and the jobs into a
run directory, and launches the group. Every rank appends one JSON line per
job; the parent follows those files while the group runs, combines the ranks
of each job, and relaunches after a launch ends early (a rank raised, hung
or died) for the jobs not yet run.
"""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.expectations import compute_expectation, rank_device_kind, save_expectations
from shardspec.conformance.results import CaseResult, combine, not_run
from shardspec.conformance.spawn import RankServer
from shardspec.spec.case import Case

STARTUP_S = 90.0  # torch import and rendezvous, generous for 8 ranks on 2 cores
WORKER = "shardspec.conformance.worker"


@dataclass
class LaunchOptions:
    run_dir: pathlib.Path
    case_timeout_s: float = 60.0
    pg_timeout_s: float = 60.0
    max_relaunches: int = 5  # besides one launch per job known to end a launch
    poll_s: float = 0.3
    launcher: str = "auto"  # "torchrun" | "fork" | "auto" (see RunConfig.launcher)


@dataclass(frozen=True)
class Job:
    choice: ImplChoice
    case: Case


def run_cases_multiprocess(cases: list[Case], choice: ImplChoice, tp: int, options: LaunchOptions,
                           on_result: Optional[Callable[[CaseResult], None]] = None,
                           log: Callable[[str], None] = print) -> list[CaseResult]:
    """Run ``cases`` (all of group size ``tp``) for one entry; results in case order."""
    return run_jobs_multiprocess([Job(choice, case) for case in cases], tp, options, on_result, log)


def run_jobs_multiprocess(jobs: list[Job], tp: int, options: LaunchOptions,
                          on_result: Optional[Callable[[CaseResult], None]] = None,
                          log: Callable[[str], None] = print) -> list[CaseResult]:
    """Run ``jobs`` (all of group size ``tp``) in as few launches as possible; results in job order."""
    run_dir = options.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    device_kind = rank_device_kind(tp)
    cases = list({job.case.case_id: job.case for job in jobs}.values())
    expectations = {case.case_id: compute_expectation(case, options.pg_timeout_s, device_kind) for case in cases}
    save_expectations(run_dir / "expectations.pt", expectations)
    torch.save(cases, run_dir / "cases.pt")
    position = {case.case_id: i for i, case in enumerate(cases)}
    (run_dir / "jobs.json").write_text(json.dumps(
        [{"impl": job.choice.impl, "impl_odd": job.choice.impl_odd, "case": position[job.case.case_id]}
         for job in jobs]))
    results: dict[int, CaseResult] = {}
    # Jobs after which the reference itself leaves peers waiting in a
    # collective end a launch: run them last, so they cost fewer relaunches.
    breaking = {i for i, job in enumerate(jobs) if _breaks_group(expectations[job.case.case_id])}
    remaining = [i for i in range(len(jobs)) if i not in breaking] + sorted(breaking)
    launches = options.max_relaunches + len(breaking) + 1
    starter = _GroupStarter(run_dir, device_kind, options.launcher)
    for launch_number in range(launches):
        if not remaining:
            break
        log(f"  launch {launch_number + 1}: tp {tp}, {len(remaining)} job(s), {_labels(jobs, remaining)}")
        outcome = _launch(jobs, remaining, tp, options, f"launch{launch_number}", results, on_result, starter)
        remaining = [i for i in remaining if i not in results]
        if outcome is not None:  # the group never started: relaunching cannot help
            for index in remaining:
                results[index] = not_run(jobs[index].case, jobs[index].choice.label, outcome)
            remaining = []
    for index in remaining:
        results[index] = not_run(jobs[index].case, jobs[index].choice.label,
                                 f"not run: {launches - 1} relaunches used up")
    return [results[i] for i in range(len(jobs))]


def _labels(jobs: list[Job], indices: list[int]) -> str:
    return ", ".join(dict.fromkeys(jobs[i].choice.label for i in indices))


def _breaks_group(expectation) -> bool:
    outs = expectation.expected
    if all(out.error is None for out in outs):
        return False
    return not all(out.error is not None and len(out.wire) == len(outs[0].wire) for out in outs)


_SERVER: Optional[RankServer] = None  # shared by the launches of this process, while its environment holds


def _rank_server(env: dict[str, str], run_dir: pathlib.Path, name: str) -> RankServer:
    global _SERVER
    if _SERVER is None or not _SERVER.alive or _SERVER.env != env:
        if _SERVER is not None:
            _SERVER.close()
        _SERVER = RankServer(WORKER, [str(run_dir)], env, run_dir / f"server-{name}.log")
        atexit.register(_SERVER.close)
    return _SERVER


class _GroupStarter:
    """Starts the group of each launch: ``torchrun --standalone``, or forks of one preloaded rank
    server on the CPU (a new server after one was killed). CUDA does not survive a fork, so ranks
    on GPUs always get fresh processes."""

    def __init__(self, run_dir: pathlib.Path, device_kind: str, launcher: str = "auto"):
        if launcher not in ("auto", "torchrun", "fork"):
            raise ValueError(f"launcher {launcher!r}: expected auto, torchrun or fork")
        self.run_dir, self.device_kind = run_dir, device_kind
        self.use_torchrun = launcher == "torchrun" or (launcher == "auto" and device_kind != "cpu")

    def start(self, tp: int, name: str, log_path: pathlib.Path):
        args = [str(self.run_dir), str(self.run_dir / f"{name}.json")]
        env = _worker_env(self.device_kind)
        if self.use_torchrun:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--max-restarts", "0",
                       "--nproc-per-node", str(tp), "-m", WORKER, *args]
        elif self.device_kind != "cpu":
            command = [sys.executable, "-m", "shardspec.conformance.spawn", str(tp), WORKER, *args]
        else:
            log_path.write_text("")
            return _rank_server(env, self.run_dir, name).start(tp, args, log_path)
        with open(log_path, "w") as log_file:
            return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=env)


def _launch(jobs, indices, tp, options, name, results, on_result, starter) -> Optional[str]:
    """One launch of the group. Returns a reason when the group never became ready."""
    run_dir = options.run_dir
    spec = {"job_indices": indices, "device": starter.device_kind,
            "case_timeout_s": options.case_timeout_s, "pg_timeout_s": options.pg_timeout_s}
    (run_dir / f"{name}.json").write_text(json.dumps(spec))
    log_path = run_dir / f"{name}.log"
    limit = STARTUP_S + len(indices) * (options.case_timeout_s + 5.0)
    follower = _Follower(run_dir, name, tp)
    proc = starter.start(tp, name, log_path)
    ended = _follow(proc, limit, follower, jobs, indices, results, on_result, options.poll_s)
    follower.read()
    if not follower.ready:
        return f"the group did not start (exit {proc.returncode}); log {log_path}:\n{_tail(log_path)}"
    _settle_broken_job(jobs, indices, results, follower, ended, on_result)
    return None


def _worker_env(device_kind: str) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"  # the expectations are computed with one thread too
    if device_kind == "cpu":
        # Ranks on the CPU (no GPU, or fewer GPUs than ranks): Triton kernels
        # can only run in its interpreter there.
        env["TRITON_INTERPRET"] = "1"
    return env


def _follow(proc, limit, follower, jobs, indices, results, on_result, poll_s) -> str:
    """Combine jobs as their records arrive; returns how the launch ended."""
    deadline = time.monotonic() + limit
    while True:
        exited = proc.poll() is not None
        follower.read()
        _take_complete(jobs, indices, results, follower, on_result)
        if exited:
            return f"the launch ended (exit {proc.returncode})"
        if all(i in results for i in indices):
            _let_finish(proc, grace_s=3.0)  # every record is in; shutdown adds nothing
            return "the launch finished"
        if time.monotonic() > deadline:
            _kill_group(proc)
            return f"the launch exceeded its {limit:.0f}s limit and was killed"
        time.sleep(poll_s)


def _take_complete(jobs, indices, results, follower, on_result) -> None:
    for index in indices:
        if index in results:
            continue
        job = jobs[index]
        records = follower.records.get(index, {})
        if len(records) < job.case.tp_size:
            return  # jobs finish in order: nothing later is complete either
        _settle(jobs, index, results, records, on_result)


def _settle(jobs, index, results, records, on_result, ended: Optional[str] = None) -> None:
    job = jobs[index]
    results[index] = combine(job.case, job.choice.label, records, ended=ended)
    if on_result:
        on_result(results[index])


def _settle_broken_job(jobs, indices, results, follower, ended, on_result) -> None:
    """The first unfinished job fails with what is known, unless a rank left on purpose before it."""
    for index in indices:
        if index in results:
            continue
        records = follower.records.get(index, {})
        if records or not follower.left_on_purpose:
            _settle(jobs, index, results, records, on_result, ended)
        return


def _let_finish(proc, grace_s: float) -> None:
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tail(path: pathlib.Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class _Follower:
    """Reads the ranks' JSONL files incrementally (lines may be half-written)."""

    def __init__(self, run_dir: pathlib.Path, name: str, tp: int):
        self.paths = [run_dir / f"{name}-rank{rank}.jsonl" for rank in range(tp)]
        self.offsets = [0] * tp
        self.records: dict[int, dict[int, dict[str, Any]]] = {}  # job index -> rank -> record
        self.ready: set[int] = set()
        # A rank recorded why it left the launch (error, hang, suite failure).
        self.left_on_purpose = False

    def read(self) -> None:
        for rank, path in enumerate(self.paths):
            if not path.exists():
                continue
            with open(path, "rb") as f:
                f.seek(self.offsets[rank])
                chunk = f.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self.offsets[rank] += len(complete)
            for line in complete.splitlines():
                self._add(rank, line)

    def _add(self, rank: int, line: bytes) -> None:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            return
        if record.get("event") == "ready":
            self.ready.add(rank)
        elif "job" in record:
            self.records.setdefault(record["job"], {})[rank] = record
            if record.get("timeout") or record.get("harness_error") or not record.get("aligned", True):
                self.left_on_purpose = True
