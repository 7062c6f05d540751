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
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from shardspec.conformance.harness.crashes import CrashBudget
from shardspec.conformance.harness.expectations import rank_device_kind, save_expectations
from shardspec.conformance.harness.external import JOIN_S, ExternalGroup, rank_command
from shardspec.conformance.harness.frames import FrameLog, decode_frames
from shardspec.conformance.harness.group import Job
from shardspec.conformance.harness.spawn import RankServer
from shardspec.conformance.harness.transcript import cut_frame, read_frames
from shardspec.conformance.record import ERROR, FAIL, NOT_RUN, CaseResult, not_run

STARTUP_S = 90.0  # torch import and rendezvous, generous for 8 ranks on 2 cores
WORKER = "shardspec.conformance.harness.worker"


@dataclass
class LaunchOptions:
    run_dir: pathlib.Path
    case_timeout_s: float = 60.0
    pg_timeout_s: float = 60.0
    max_relaunches: int = 5  # besides one launch per job known to end a launch
    poll_s: float = 0.3
    launcher: str = "auto"  # "torchrun" | "fork" | "auto" (see RunConfig.launcher)
    max_crashes: int = 3  # cases of one entry ending alike before its others are not run (0: never)
    # TP groups in the world of each launch the suite starts (blocks of tp consecutive ranks, each running
    # every job, each judged); an external launch holds as many as the ranks that join make (WORLD_SIZE / tp).
    tp_groups: int = 1


def run_jobs_multiprocess(
    jobs: list[Job],
    tp: int,
    options: LaunchOptions,
    judge,
    on_result: Callable[[CaseResult], None] | None = None,
    log: Callable[[str], None] = print,
    servers: dict | None = None,
) -> list[CaseResult]:
    """Run ``jobs`` (all of group size ``tp``) in as few launches as possible; results in job order.
    ``servers``: where the preloaded rank server of CPU launches is kept between calls (its owner closes it)."""
    run_dir = options.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    device_kind = (
        rank_device_kind(tp * options.tp_groups)
        if options.launcher != "external"
        else ("cuda" if torch.cuda.is_available() else "cpu")
    )  # one GPU per rank on each node
    cases = list({job.case.case_id: job.case for job in jobs}.values())
    judge = judge.at(device_kind)  # the judge decodes and rebuilds on the ranks' device kind
    expectations = {case.case_id: judge.expectation(case) for case in cases}
    save_expectations(run_dir / "expectations.pt", expectations)
    torch.save(cases, run_dir / "cases.pt")
    position = {case.case_id: i for i, case in enumerate(cases)}
    (run_dir / "jobs.json").write_text(
        json.dumps(
            [
                {"impl": job.choice.impl, "impl_odd": job.choice.impl_odd, "case": position[job.case.case_id]}
                for job in jobs
            ]
        )
    )
    results: dict[int, CaseResult] = {}
    # Jobs after which the reference itself leaves peers waiting in a
    # collective end a launch: run them last, so they cost fewer relaunches.
    breaking = {i for i, job in enumerate(jobs) if _breaks_group(expectations[job.case.case_id])}
    remaining = [i for i in range(len(jobs)) if i not in breaking] + sorted(breaking)
    starter = _GroupStarter(run_dir, device_kind, options.launcher, log, {} if servers is None else servers)
    launch_number, idle_launches = 0, 0
    crashes = CrashBudget(options.max_crashes)
    # A launch that judged at least one job may be followed by another (each ends at most one job early);
    # launches that judge nothing are allowed max_relaunches times.
    while remaining and idle_launches <= options.max_relaunches:
        log(f"  launch {launch_number + 1}: tp {tp}, {len(remaining)} job(s), {_labels(jobs, remaining)}")
        outcome = _launch(jobs, remaining, tp, options, f"launch{launch_number}", results, on_result, starter, judge)
        launch_number += 1
        for index in remaining:
            if index in results:
                crashes.note(results[index])
        for index in remaining:
            reason = None if index in results else crashes.spent(jobs[index].choice.label, tp)
            if reason is not None:
                results[index] = not_run(jobs[index].case, jobs[index].choice.label, reason)
        still = [i for i in remaining if i not in results]
        idle_launches += len(still) == len(remaining)
        remaining = still
        if outcome is not None:  # the group never started: relaunching cannot help
            for index in remaining:
                results[index] = not_run(jobs[index].case, jobs[index].choice.label, outcome)
            remaining = []
    for index in remaining:
        results[index] = not_run(
            jobs[index].case,
            jobs[index].choice.label,
            f"not run: {options.max_relaunches + 1} launches in a row judged nothing",
        )
    return [results[i] for i in range(len(jobs))]


def _labels(jobs: list[Job], indices: list[int]) -> str:
    return ", ".join(dict.fromkeys(jobs[i].choice.label for i in indices))


def _breaks_group(expectation) -> bool:
    outs = expectation.expected
    if all(out.error is None for out in outs):
        return False
    return not all(out.error is not None and len(out.wire) == len(outs[0].wire) for out in outs)


def _rank_server(servers: dict, env: dict[str, str], run_dir: pathlib.Path, name: str) -> RankServer:
    """The preloaded server in ``servers``, or a new one after it died or the environment changed."""
    server = servers.get("cpu")
    if server is None or not server.alive or server.env != env:
        if server is not None:
            server.close()
        server = servers["cpu"] = RankServer(WORKER, [str(run_dir)], env, run_dir / f"server-{name}.log")
        atexit.register(server.close)  # also when the run ends without closing its group
    return server


class _GroupStarter:
    """Starts the group of each launch: ``torchrun --standalone``, or forks of one preloaded rank
    server on the CPU (a new server after one was killed). CUDA does not survive a fork, so ranks
    on GPUs always get fresh processes."""

    def __init__(self, run_dir: pathlib.Path, device_kind: str, launcher: str = "auto", log=print, servers=None):
        if launcher not in ("auto", "torchrun", "fork", "external"):
            raise ValueError(f"launcher {launcher!r}: expected auto, torchrun, fork or external")
        self.run_dir, self.device_kind, self.log = run_dir, device_kind, log
        self.servers = {} if servers is None else servers
        self.external = launcher == "external"
        self.use_torchrun = launcher == "torchrun" or (launcher == "auto" and device_kind != "cpu")

    def start(self, tp: int, name: str, log_path: pathlib.Path, world: int | None = None):
        """``world`` ranks (default ``tp``), in TP groups of ``tp``."""
        world = tp if world is None else world
        args = [str(self.run_dir), str(self.run_dir / f"{name}.json")]
        env = _worker_env(self.device_kind)
        if self.external:
            command = rank_command(self.run_dir, self.run_dir / f"{name}.json", tp)
            (self.run_dir / f"{name}.command").write_text(command + "\n")
            self.log(f"  waiting for {tp} ranks started by your launcher; on every node run:\n    {command}")
            return ExternalGroup(command)
        if self.use_torchrun:
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--max-restarts",
                "0",
                "--nproc-per-node",
                str(world),
                "-m",
                WORKER,
                *args,
            ]
        elif self.device_kind != "cpu":
            command = [sys.executable, "-m", "shardspec.conformance.harness.spawn", str(world), WORKER, *args]
        else:
            log_path.write_text("")
            return _rank_server(self.servers, env, self.run_dir, name).start(world, args, log_path)
        with open(log_path, "w") as log_file:
            return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _launch(jobs, indices, tp, options, name, results, on_result, starter, judge) -> str | None:
    """One launch of the group. Returns a reason when the group never became ready."""
    run_dir = options.run_dir
    spec = {
        "job_indices": indices,
        "tp": tp,  # a world of more ranks holds several TP groups of tp
        "device": starter.device_kind,
        "case_timeout_s": options.case_timeout_s,
        "pg_timeout_s": options.pg_timeout_s,
    }
    (run_dir / f"{name}.json").write_text(json.dumps(spec))
    log_path = run_dir / f"{name}.log"
    startup = JOIN_S if starter.external else STARTUP_S
    limit = startup + len(indices) * (options.case_timeout_s + 5.0)
    follower = _Follower(run_dir, name, tp, 1 if starter.external else options.tp_groups)
    proc = starter.start(tp, name, log_path, tp * options.tp_groups)
    settle = _Settler(jobs, results, follower, judge, on_result)
    try:
        ended = _follow(proc, limit, follower, indices, settle, options)
    finally:  # interrupted (SIGINT/SIGTERM) or failed: leave no rank behind
        if proc.poll() is None and not all(i in results for i in indices):
            _kill_group(proc)
    follower.read()
    if not follower.ready:
        return f"the group did not start (exit {proc.returncode}); log {log_path}:\n{_tail(log_path)}"
    follower.note_cut(indices)
    settle.broken_job(indices, ended, getattr(proc, "culprit", None))
    return None


def _worker_env(device_kind: str) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"  # the expectations are computed with one thread too
    if device_kind == "cpu":
        # Ranks on the CPU (no GPU, or fewer GPUs than ranks): Triton kernels
        # can only run in its interpreter there.
        env["TRITON_INTERPRET"] = "1"
    return env


def _follow(proc, limit, follower, indices, settle, options) -> str:
    """Judge jobs as their transcripts complete; returns how the launch ended.

    Besides the launch's limit, a watchdog here ends a launch in which no rank
    sent a frame for longer than a case may take: it needs nothing of the
    ranks, so a rank that holds the GIL or was stopped cannot escape it.
    """
    deadline = time.monotonic() + limit
    quiet_limit = options.case_timeout_s + max(2.0, options.case_timeout_s / 2) + 5.0
    while True:
        exited = proc.poll() is not None
        if follower.read():
            settle.complete(indices)
        if exited:
            return f"the launch ended (exit {proc.returncode})"
        if all(i in settle.results for i in indices):
            _let_finish(proc, grace_s=3.0)  # every record is in; shutdown adds nothing
            return "the launch finished"
        quiet = time.monotonic() - follower.last_frame
        if follower.ready and quiet > quiet_limit:
            stopped = follower.stopped_ranks()
            _kill_group(proc)
            how = (
                f"rank(s) {', '.join(map(str, stopped))} stopped by a signal (state T)"
                if stopped
                else "a rank hung where its own watchdog could not run (e.g. holding the GIL)"
            )
            return f"no rank sent anything for {quiet:.0f}s: {how}; the group was killed"
        if time.monotonic() > deadline:
            _kill_group(proc)
            return f"the launch exceeded its {limit:.0f}s limit and was killed"
        time.sleep(options.poll_s)


class _Settler:
    """Turns complete transcripts into results, in job order."""

    def __init__(self, jobs, results, follower, judge, on_result):
        self.jobs, self.results, self.follower, self.judge, self.on_result = jobs, results, follower, judge, on_result

    def complete(self, indices) -> None:
        for index in indices:
            if index in self.results:
                continue
            groups = self.follower.group_transcripts(index)
            if any(sum(t.ended for t in ranks.values()) < self.jobs[index].case.tp_size for ranks in groups):
                return  # jobs finish in order: nothing later is complete either
            self.settle(index, groups)

    def settle(self, index, groups, ended: str | None = None, culprit=None) -> None:
        """``groups``: each TP group's transcripts by rank in the group (one group's alone: that group's);
        ``culprit``: its rank is a world rank."""
        groups = [groups] if isinstance(groups, dict) else list(groups) or [{}]
        job = self.jobs[index]
        tp = job.case.tp_size
        results = [
            self._judged(job, ranks, ended, _in_group(culprit, number, tp)) for number, ranks in enumerate(groups)
        ]
        self.results[index] = results[0] if len(results) == 1 else across_groups(results, tp)
        if self.on_result:
            self.on_result(self.results[index])

    def _judged(self, job, transcripts, ended, culprit) -> CaseResult:
        try:
            decoded = {rank: decode_frames(log, self.judge.device) for rank, log in transcripts.items()}
            return self.judge.transcripts(job.case, job.choice.label, decoded, ended, culprit)
        except Exception as exc:  # a defect of the judge: this case, not the run, ends with it
            return judge_failed(job, exc)

    def broken_job(self, indices, ended, culprit) -> None:
        """The first unfinished job fails with what is known, unless a rank left on purpose before it."""
        for index in indices:
            if index in self.results:
                continue
            groups = self.follower.group_transcripts(index)
            if any(groups) or not self.follower.left_on_purpose:
                self.settle(index, groups, ended, culprit)
            return


def _in_group(culprit: dict | None, group: int, tp: int) -> dict | None:
    """The launcher's culprit (a world rank) as seen by TP group ``group``: its rank there, or None."""
    if culprit is None or not isinstance(culprit.get("rank"), int):
        return culprit
    if culprit["rank"] // tp != group:
        return None
    return {**culprit, "rank": culprit["rank"] % tp}


def across_groups(results: list[CaseResult], tp: int) -> CaseResult:
    """One job's result in a world of several TP groups, each of which ran it: every group's violations and
    errors, each message naming its group; the worst status; a pass only where every group passed."""

    def named(entries: list[dict], group: int) -> list[dict]:
        where = f"TP group {group} (world ranks {group * tp}-{group * tp + tp - 1})"
        return [{**entry, "message": f"{where}: {entry.get('message', '')}"} for entry in entries]

    violations = [v for number, result in enumerate(results) for v in named(result.violations, number)]
    errors = [e for number, result in enumerate(results) for e in named(result.errors, number)]
    statuses = [result.status for result in results]
    status = next((s for s in (ERROR, FAIL, NOT_RUN) if s in statuses), statuses[0])
    judged = set.intersection(*(set(result.judged) for result in results)) | {v["invariant_id"] for v in violations}
    keys = {key for result in results for key in result.timings}
    timings = {key: max(result.timings.get(key, 0.0) for result in results) for key in keys}
    reason = "; ".join(dict.fromkeys(result.reason for result in results if result.reason))
    return dataclasses.replace(
        results[0],
        status=status,
        violations=violations,
        errors=errors,
        judged=sorted(judged),
        timings=timings,
        reason=reason,
    )


def judge_failed(job: Job, exc: Exception) -> CaseResult:
    import traceback

    message = f"the judge failed on this case's transcripts: {type(exc).__name__}: {exc}"
    error = {"rank": None, "kind": "harness", "message": message, "traceback": traceback.format_exc()}
    return CaseResult(job.case, job.choice.label, ERROR, errors=[error])


def _let_finish(proc, grace_s: float) -> None:
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)


def _kill_group(proc) -> None:
    if isinstance(proc, ExternalGroup):
        proc.stop()
        return
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
    """Reads the ranks' frame files incrementally (the last frame may be half-written); ranks are world ranks,
    in TP groups of ``tp`` consecutive ones."""

    def __init__(self, run_dir: pathlib.Path, name: str, tp: int, groups: int = 1):
        self.run_dir, self.name, self.tp = run_dir, name, tp
        self.paths: list[pathlib.Path] = []  # by world rank
        self.offsets: list[int] = []
        self._grow(tp * groups)
        self.transcripts: dict[int, dict[int, FrameLog]] = {}  # job index -> rank -> frames
        self.ready: set[int] = set()
        self.pids: dict[int, int] = {}
        self.last_frame = time.monotonic()
        # A rank recorded why it left the launch (error, hang, suite failure).
        self.left_on_purpose = False
        self.pending: dict[int, list[str]] = {}  # rank -> unreadable frames not yet given to a job

    def read(self) -> bool:
        """Whether any new frame arrived."""
        new = False
        for rank, path in enumerate(self.paths):
            if not path.exists():
                continue
            with open(path, "rb") as f:
                f.seek(self.offsets[rank])
                chunk = f.read()
            frames, used = read_frames(chunk)
            self.offsets[rank] += used
            for frame in frames:
                self._add(rank, frame)
            new |= bool(frames)
        if new:
            self.last_frame = time.monotonic()
        return new

    def _add(self, rank: int, frame: dict[str, Any]) -> None:
        if "unreadable" in frame:
            self._note(rank, f"rank {rank} sent a frame the judge cannot read: {frame['unreadable']}")
        elif frame.get("event") == "ready":
            self.ready.add(rank)
            self.pids[rank] = frame.get("pid")
            world = frame.get("world_size")
            if isinstance(world, int) and world > len(self.paths) and world % self.tp == 0:
                self._grow(world)  # ranks started by another launcher: a world of several TP groups
        elif frame.get("job") is not None:
            transcript = self.transcripts.setdefault(frame["job"], {}).setdefault(rank, FrameLog())
            for why in self.pending.pop(rank, []):  # the unreadable frame began this job
                transcript.add({"undecodable": why})
            transcript.add(frame)
            if frame.get("timeout") or frame.get("harness_error") or frame.get("aligned") is False:
                self.left_on_purpose = True

    def _grow(self, world: int) -> None:
        for rank in range(len(self.paths), world):
            self.paths.append(self.run_dir / f"{self.name}-rank{rank}.frames")
            self.offsets.append(0)

    @property
    def groups(self) -> int:
        return len(self.paths) // self.tp

    def group_transcripts(self, job: int) -> list[dict]:
        """Per TP group (blocks of tp world ranks), its transcripts of ``job`` by rank in the group."""
        ranks = self.transcripts.get(job, {})
        groups: list[dict] = [{} for _ in range(self.groups)]
        for rank, transcript in ranks.items():
            groups[rank // self.tp][rank % self.tp] = transcript
        return groups

    def _note(self, rank: int, why: str) -> None:
        """A frame of ``rank`` that cannot be read: for the job it is in, or (after that job's last frame)
        for the next job it sends a frame of."""
        open_jobs = [job for job, ranks in self.transcripts.items() if rank in ranks and not ranks[rank].ended]
        if open_jobs:
            self.transcripts[max(open_jobs)][rank].add({"undecodable": why})
        else:
            self.pending.setdefault(rank, []).append(why)

    def note_cut(self, indices: list[int]) -> None:
        """After the launch: a rank's transcript that ends inside a frame, or an unreadable frame no later
        frame placed, belongs to the first of ``indices`` whose last frame that rank never sent."""
        for rank, path in enumerate(self.paths):
            rest = path.read_bytes()[self.offsets[rank] :] if path.exists() else b""
            notes = self.pending.pop(rank, []) + [f"rank {rank}'s transcript is cut: {cut_frame(rest)}"] * bool(rest)
            job = next((i for i in indices if not self._ended(i, rank)), None)
            for why in notes if job is not None else ():
                self.transcripts.setdefault(job, {}).setdefault(rank, FrameLog()).add({"undecodable": why})

    def _ended(self, job: int, rank: int) -> bool:
        transcript = self.transcripts.get(job, {}).get(rank)
        return transcript is not None and transcript.ended

    def stopped_ranks(self) -> list[int]:
        """Ranks whose process is stopped (``T`` in /proc, e.g. after SIGSTOP)."""
        stopped = []
        for rank, pid in sorted(self.pids.items()):
            try:
                state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError, TypeError):
                continue
            if state in ("T", "t"):
                stopped.append(rank)
        return stopped
