"""The one protocol every way of running ranks implements, and the choice of one for a run.

A :class:`Group` runs jobs (one case run by one entry, ``A`` or ``A/B``) at one
group size and returns one :class:`~shardspec.conformance.record.CaseResult`
per job, in job order, handing each to ``on_result`` as soon as it is judged (an
interrupted run keeps what was judged). The runner drives every group through
this protocol alone; what differs between groups is only where the ranks run:

- :class:`ProcessGroup`: one process per rank (forks of a preloaded rank server
  on the CPU, ``torchrun`` on GPUs, or ranks started by the user's own launcher
  across nodes); the judge is this process, which never imports the
  implementation under test.
- :class:`ThreadGroup`: every rank a thread of this process, taking turns, in
  shardspec's lockstep group or torch's threaded backend (tp > 1 on one GPU);
  the checks then run in the implementation's process.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.record import CaseResult
from shardspec.spec.case import Case

OnResult = Callable[[CaseResult], None]


@dataclass(frozen=True)
class Job:
    choice: ImplChoice
    case: Case


class Group(Protocol):
    def describe(self) -> str:
        """Where the ranks run, for the run's header."""

    def run(self, jobs: list[Job], tp: int, judge, on_result: OnResult) -> list[CaseResult]:
        """``jobs`` (all of group size ``tp``): one result per job, in job order, each given by ``judge`` (a
        :class:`~shardspec.conformance.judge.verdicts.Judge`, moved to the device the ranks run on)."""

    def close(self) -> None:
        """Let go of what the group keeps between group sizes (no process is left behind)."""


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

    def run(self, jobs: list[Job], tp: int, judge, on_result: OnResult) -> list[CaseResult]:
        from shardspec.conformance.harness.multiprocess import LaunchOptions, run_jobs_multiprocess

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


@dataclass
class ThreadGroup:
    kind: str = "lockstep"  # one of options.THREAD_GROUPS
    device: str = "auto"  # auto | cpu | cuda
    pg_timeout_s: float = 60.0
    max_crashes: int = 3  # see harness/crashes.py (here: constructors that fail alike)

    def describe(self) -> str:
        from shardspec.conformance.harness.expectations import expectation_device

        return f"in-process ({self.kind} group, ranks as threads on {expectation_device(self.device)})"

    def run(self, jobs: list[Job], tp: int, judge, on_result: OnResult) -> list[CaseResult]:
        from shardspec.conformance.harness.inprocess import run_jobs_in_process

        return run_jobs_in_process(
            jobs,
            judge,
            self.pg_timeout_s,
            on_result,
            group=self.kind,
            device=self.device,
            max_crashes=self.max_crashes,
            tp=tp,
        )

    def close(self) -> None:
        pass


def group_for(config, run_dir: pathlib.Path, log: Callable[[str], None]) -> Group:
    """The group a run's configuration (:class:`shardspec.conformance.runner.RunConfig`) asks for."""
    if config.in_process:
        return ThreadGroup(
            config.in_process_group, config.in_process_device, config.pg_timeout_s, max_crashes=config.max_crashes
        )
    return ProcessGroup(
        run_dir,
        config.case_timeout_s,
        config.pg_timeout_s,
        config.launcher,
        log,
        max_crashes=config.max_crashes,
        tp_groups=config.tp_groups,
        share_gpus=config.share_gpus,
    )
