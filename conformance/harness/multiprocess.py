"""Multi-process runs: one process per rank (like ``torchrun``, see :mod:`.spawn`) over many jobs.

A job is one case run by one entry (``A`` or ``A/B``). Each entry gets rank
processes of its own: its launches run only its jobs, forked on the CPU from a
rank server that imported only its implementations. What an implementation
does to its process (torch's default dtype, a module it patches, any global
state) then reaches no other entry's verdict; the cost is one more server
start (importing torch) per entry of a run. The parent computes the reference
expectations once per case, saves them with the cases and the jobs into a
run directory, and launches the group. Every rank appends one JSON line per
job; the parent follows those files while the group runs, combines the ranks
of each job, and relaunches after a launch ends early (a rank raised, hung
or died) for the jobs not yet run.
"""

from __future__ import annotations

import functools
import json
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from shardspec.conformance.harness.crashes import CrashBudget, invalid_input, suspect_crash
from shardspec.conformance.harness.expectations import rank_placement
from shardspec.conformance.harness.external import JOIN_S
from shardspec.conformance.harness.follower import Follower
from shardspec.conformance.harness.group import Job, OnResult
from shardspec.conformance.harness.launch import (
    GroupStarter,
    first_error,
    kill_group,
    let_finish,
    run_zygote,
    torchrun_culprit,
)
from shardspec.conformance.harness.probe import probe
from shardspec.conformance.harness.rank_plan import blinded, plan_of, real_names, save_plans
from shardspec.conformance.harness.settle import Settler
from shardspec.conformance.record import CaseResult, not_run
from shardspec.spec.rules import Rules

STARTUP_S = 90.0  # torch import and rendezvous, generous for 8 ranks on 2 cores
# After a rank gave up waiting in a collective for a silent peer: time for what that peer sent last (its own
# watchdog's frame, say) to arrive before it is taken as out of reach. Short, as a GIL hang costs it per case.
PEER_GRACE_S = 2.0
# A CPU rank whose watchdog thread has not run for this long (at most the case timeout), and whose main
# thread is not running either (Follower.without_heartbeat), holds the GIL asleep or is stopped: its launch
# ends then, not after a peer's process-group timeout. Torch ops, numpy's large ones and Python code let
# the thread run; on a GPU, CUDA's and NCCL's first calls may not, for seconds.
HEARTBEAT_LIMIT_S = 3.0


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
    # Where a world has more ranks than GPUs: run them on the GPUs anyway, shared, with gloo collectives.
    share_gpus: bool = False


def run_jobs_multiprocess(
    jobs: list[Job],
    tp: int,
    options: LaunchOptions,
    judge,
    on_result: Callable[[CaseResult], None] | None = None,
    log: Callable[[str], None] = print,
    servers: dict | None = None,
    failures: list[dict] | None = None,
) -> list[CaseResult]:
    """Run ``jobs`` (all of group size ``tp``) in as few launches as possible; results in job order.
    ``servers``: where the preloaded rank server of CPU launches is kept between calls (its owner closes it);
    ``failures``: where each launch whose group never started is told (:func:`launch_failure`)."""
    run_dir = options.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    if options.launcher == "external":  # one GPU per rank on each node
        device_kind, backend = ("cuda", "nccl") if torch.cuda.is_available() else ("cpu", "gloo")
    else:
        device_kind, backend = rank_placement(tp * options.tp_groups, options.share_gpus)
    cases = list({job.case.case_id: job.case for job in jobs}.values())
    judge = judge.at(device_kind)  # the judge decodes and rebuilds on the ranks' device kind
    expectations = {case.case_id: judge.expectation(case) for case in cases}
    # What the ranks get: the cases without the verdict's terms, and where each rank must have raised.
    save_plans(run_dir / "plans.json", [plan_of(case, expectations[case.case_id]) for case in cases])
    torch.save(blinded(cases), run_dir / "cases.pt")
    position = {case.case_id: i for i, case in enumerate(cases)}
    # Each case carries the rules it is judged under (cases.pt), as this process resolved them: a rank
    # never reads a profile file (its user may have changed it since) nor looks a profile up by name.
    (run_dir / "jobs.json").write_text(
        json.dumps(
            {
                "jobs": [
                    {"impl": job.choice.impl, "impl_odd": job.choice.impl_odd, "case": position[job.case.case_id]}
                    for job in jobs
                ],
            }
        )
    )
    results: dict[int, CaseResult] = {}
    launches = _Launches(jobs, tp, options, judge, on_result, log, results, failures, real_names(cases))
    servers = {} if servers is None else servers
    for choice in dict.fromkeys(job.choice for job in jobs):  # each entry in processes of its own
        mine = [i for i, job in enumerate(jobs) if job.choice == choice]
        # Jobs after which the reference itself leaves peers waiting in a
        # collective end a launch: run them last, so they cost fewer relaunches.
        breaking = {i for i in mine if _breaks_group(expectations[jobs[i].case.case_id])}
        starter = GroupStarter(
            run_dir, device_kind, options.launcher, log, servers, backend, implementations=tuple(choice.names())
        )
        launches.run_entry([i for i in mine if i not in breaking] + sorted(breaking), starter)
    return [results[i] for i in range(len(jobs))]


@dataclass
class _Launches:
    """The launches of one call of :func:`run_jobs_multiprocess`, numbered across its entries."""

    jobs: list[Job]
    tp: int
    options: LaunchOptions
    judge: object
    on_result: Callable[[CaseResult], None] | None
    log: Callable[[str], None]
    results: dict[int, CaseResult]
    failures: list[dict] | None
    names: dict[str, str]  # a rank's name of each case (rank_plan.blinded) to its id
    number: int = 0

    def run_entry(self, remaining: list[int], starter: GroupStarter) -> None:
        """Run the jobs ``remaining`` (of one entry) in launches of ``starter``'s, until each has a result."""
        jobs, tp, options, log, results = self.jobs, self.tp, self.options, self.log, self.results
        idle_launches = 0
        crashes = CrashBudget(options.max_crashes)
        alone: set[int] = set()  # jobs run again in a launch of their own after a suspect crash
        # A launch that judged at least one job may be followed by another (each ends at most one job early);
        # launches that judge nothing are allowed max_relaunches times.
        while remaining and idle_launches <= options.max_relaunches:
            log(f"  launch {self.number + 1}: tp {tp}, {len(remaining)} job(s), {_labels(jobs, remaining)}")
            held: dict[int, CaseResult] = {}
            deliver = _holding_suspects(self.on_result, results, remaining, alone, held)
            name = f"launch{self.number}"
            settle = Settler(jobs, results, None, self.judge, deliver, self.names)
            outcome = _launch(remaining, tp, options, name, settle, starter)
            self.number += 1
            for index in held:  # judged again in the next launch, first, where nothing ran before it
                del results[index]
                alone.add(index)
                before = remaining[: remaining.index(index)]
                log(
                    f"  {jobs[index].case.case_id}: a rank was killed by a signal after {len(before)} other case(s) "
                    f"in the same processes ({', '.join(jobs[i].case.case_id for i in before[-3:])} last); it runs "
                    "again on its own before the crash is blamed on it"
                )
            remaining = [*held, *(i for i in remaining if i not in held)]
            for index in remaining:
                if index in results:
                    crashes.note(results[index])
            for index in remaining:
                job = jobs[index]
                reason = None if index in results else crashes.spent(job.choice.label, tp, invalid_input(job.case))
                if reason is not None:
                    results[index] = not_run(job.case, job.choice.label, reason)
            still = [i for i in remaining if i not in results]
            idle_launches += len(still) == len(remaining)
            remaining = still
            if outcome is not None:  # the group never started: relaunching cannot help
                self._not_started(outcome, remaining)
                remaining = []
        for index in remaining:
            results[index] = not_run(
                jobs[index].case,
                jobs[index].choice.label,
                f"not run: {options.max_relaunches + 1} launches in a row judged nothing",
            )

    def _not_started(self, outcome: dict, remaining: list[int]) -> None:
        failure = {"tp": self.tp, "launch": self.number, **outcome}
        self.log(f"  launch {self.number} did not run: {failure['reason']}; full log {failure['log']}")
        self.log("\n".join("    | " + line for line in failure["error"].splitlines()))
        if self.failures is not None:
            self.failures.append(failure)
        why = f"{failure['reason']}: {failure['error'].splitlines()[-1] if failure['error'] else 'no output'}"
        for index in remaining:
            job = self.jobs[index]
            self.results[index] = not_run(job.case, job.choice.label, f"{why} (log {failure['log']})")


def _holding_suspects(on_result, results, launch: list[int], alone: set[int], held: dict[int, CaseResult]):
    """``on_result`` for one launch, holding back (into ``held``) the result of a job that is not the launch's
    first and crashed as :func:`suspect_crash` says: its processes ran other cases first."""

    def deliver(result: CaseResult) -> None:
        index = next(i for i in launch if results.get(i) is result)
        if index != launch[0] and index not in alone and suspect_crash(result):
            held[index] = result
        elif on_result is not None:
            on_result(result)

    return deliver


def _labels(jobs: list[Job], indices: list[int]) -> str:
    return ", ".join(dict.fromkeys(jobs[i].choice.label for i in indices))


def _breaks_group(expectation) -> bool:
    outs = expectation.expected
    if all(out.error is None for out in outs):
        return False
    return not all(out.error is not None and len(out.wire) == len(outs[0].wire) for out in outs)


def _launch(indices, tp, options, name, settle: Settler, starter) -> dict | None:
    """One launch of the group. Returns, when the group never became ready, why: the ``reason``, the path of
    the ``log`` that holds the ranks' output and the first lines of the ``error`` it holds."""
    run_dir = options.run_dir
    spec = {
        "job_indices": indices,
        "tp": tp,  # a world of more ranks holds several TP groups of tp
        "device": starter.device_kind,
        "backend": starter.backend,
        "case_timeout_s": options.case_timeout_s,
        "pg_timeout_s": options.pg_timeout_s,
    }
    (run_dir / f"{name}.json").write_text(json.dumps(spec))
    log_path = run_dir / f"{name}.log"
    startup = JOIN_S if starter.external else STARTUP_S
    limit = startup + len(indices) * (options.case_timeout_s + 5.0)
    follower = settle.follower = Follower(run_dir, name, tp, 1 if starter.external else options.tp_groups)
    proc = starter.start(tp, name, log_path, tp * options.tp_groups)
    results = settle.results
    try:
        beats = not starter.external and starter.device_kind == "cpu"
        ended = _follow(proc, limit, follower, indices, settle, options, beats)
    finally:  # interrupted (SIGINT/SIGTERM) or failed: leave no rank behind
        if proc.poll() is None and not all(i in results for i in indices):
            kill_group(proc)
        starter.end_strays(proc)
    follower.read()
    if not follower.ready:
        return launch_failure(proc.returncode, ended, log_path, starter)
    follower.note_cut(indices)
    culprit = getattr(proc, "culprit", None)  # the forked ranks' server says which rank failed first
    if culprit is None and starter.use_torchrun and ended.startswith("the launch ended"):
        culprit = torchrun_culprit(log_path.read_text(errors="replace") if log_path.exists() else "")
    settle.broken_job(indices, ended, culprit)
    return None


def launch_failure(code, ended: str, log_path: pathlib.Path, starter) -> dict:
    """Why a group never started: its exit status (or how the judge ended it), and the first error of its
    ranks' log (of the preloaded rank server's log, where the ranks wrote nothing: it failed to fork them)."""
    reason = f"the group did not start (exit {code})"
    if not ended.startswith("the launch ended"):  # the judge ended it: say why
        reason = f"the group did not start: {ended}"
    logs = [log_path] + sorted(starter.run_dir.glob("server-*.log"), key=lambda p: p.stat().st_mtime)[-1:]
    for path in logs:
        text = path.read_text(errors="replace") if path.exists() else ""
        if text.strip():
            return {"reason": reason, "log": str(path), "error": first_error(text)}
    return {"reason": reason, "log": str(log_path), "error": ""}


def _follow(proc, limit, follower, indices, settle, options, heartbeats: bool) -> str:
    """Judge jobs as their transcripts complete; returns how the launch ended.

    Besides the launch's limit, a watchdog here ends a launch in which no rank
    sent a frame for longer than a case may take: it needs nothing of the
    ranks, so a rank that holds the GIL or was stopped cannot escape it. It
    ends it sooner where a rank's collective timed out (its process-group
    timeout) waiting for a peer that stays silent: that peer's watchdog cannot
    run either, and the failed rank's last frame would restart the silence. Sooner
    still where the ranks are this machine's CPU processes (``heartbeats``): a rank
    whose watchdog thread stopped beating holds the GIL or is stopped.
    """
    deadline = time.monotonic() + limit
    heartbeat_limit = min(options.case_timeout_s, HEARTBEAT_LIMIT_S)
    quiet_limit = options.case_timeout_s + max(2.0, options.case_timeout_s / 2) + 5.0
    while True:
        exited = proc.poll() is not None
        if follower.read():
            settle.complete(indices)
        if exited:
            return f"the launch ended (exit {proc.returncode})"
        if all(i in settle.results for i in indices):
            let_finish(proc, grace_s=3.0)  # every record is in; shutdown adds nothing
            return "the launch finished"
        quiet = time.monotonic() - follower.last_frame
        if follower.ready and quiet > quiet_limit:
            how = _out_of_reach(follower.stopped_ranks())
            kill_group(proc)
            return f"no rank sent anything for {quiet:.0f}s: {how}; the group was killed"
        unanswered = follower.unanswered_collective(options.pg_timeout_s / 2, PEER_GRACE_S)
        if unanswered is not None:
            failed, silent = unanswered
            how = _out_of_reach(follower.stopped_ranks())
            kill_group(proc)
            since = time.monotonic() - max(follower.heard.get(rank, follower.started) for rank in silent)
            return (
                f"rank(s) {', '.join(map(str, silent))} sent nothing for {since:.0f}s, and rank {failed} gave up "
                f"waiting for them in a collective: {how}; the group was killed"
            )
        unreachable = follower.without_heartbeat(heartbeat_limit) if heartbeats else []
        if unreachable and not follower.left_on_purpose:
            how = _out_of_reach(follower.stopped_ranks())
            kill_group(proc)
            return (
                f"rank(s) {', '.join(map(str, unreachable))} stopped running Python for {heartbeat_limit:.0f}s or "
                f"more (their watchdog thread could not run): {how}; the group was killed"
            )
        if time.monotonic() > deadline:
            kill_group(proc)
            return f"the launch exceeded its {limit:.0f}s limit and was killed"
        time.sleep(options.poll_s)


def _out_of_reach(stopped: list[int]) -> str:
    """Why ranks that sent nothing could not report themselves."""
    if stopped:
        return f"rank(s) {', '.join(map(str, stopped))} stopped by a signal (state T)"
    return "a rank hung where its own watchdog could not run (e.g. holding the GIL)"


@dataclass
class ProcessGroup:
    run_dir: pathlib.Path
    case_timeout_s: float
    pg_timeout_s: float
    launcher: str = "auto"  # fork | torchrun | external | auto (fork on the CPU, torchrun on GPUs)
    log: Callable[[str], None] = print
    max_crashes: int = 3  # see harness/crashes.py
    tp_groups: int = 1  # TP groups of one launched world
    share_gpus: bool = False  # more ranks than GPUs: ranks share GPUs, collectives on gloo
    servers: dict = field(default_factory=dict)  # the preloaded rank server, kept while its environment holds
    # Each launch whose group never started: {"tp", "launch", "reason", "log", "error"} (the first lines of
    # its ranks' error), for the report.
    launch_failures: list[dict] = field(default_factory=list)

    def describe(self) -> str:
        groups = f", {self.tp_groups} TP groups per world" if self.tp_groups > 1 else ""
        where = "on shared GPUs, gloo" if self.share_gpus else "gloo or NCCL"
        return f"one process per rank ({where}){groups}"

    def probe(self, names: list[str], rules: Rules, warnings: list[str], releases: dict[str, str]) -> dict:
        """Where the ranks are forked from a zygote (the CPU), the probing child is forked from it as well."""
        run_child = None
        if self.launcher in ("auto", "fork") and not torch.cuda.is_available():
            self.run_dir.mkdir(parents=True, exist_ok=True)
            zygote = run_zygote(self.servers, self.run_dir)
            run_child = functools.partial(zygote.run_probe, base=self.run_dir / "probe")
        return probe(names, rules, warnings=warnings, releases=releases, run_child=run_child)

    def run(self, jobs: list[Job], tp: int, judge, on_result: OnResult) -> list[CaseResult]:
        options = LaunchOptions(
            self.run_dir / f"tp{tp}",
            self.case_timeout_s,
            self.pg_timeout_s,
            launcher=self.launcher,
            max_crashes=self.max_crashes,
            tp_groups=self.tp_groups,
            share_gpus=self.share_gpus,
        )
        return run_jobs_multiprocess(
            jobs, tp, options, judge, on_result, self.log, self.servers, failures=self.launch_failures
        )

    def close(self) -> None:
        for server in self.servers.values():
            server.close()
        self.servers.clear()
