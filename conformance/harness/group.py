"""The one protocol every way of running ranks implements.

A :class:`Group` runs jobs (one case run by one entry, ``A`` or ``A/B``) at one
group size and returns one :class:`~shardspec.conformance.record.CaseResult`
per job, in job order, handing each to ``on_result`` as soon as it is judged (an
interrupted run keeps what was judged). The runner drives every group through
this protocol alone; what differs between groups is only where the ranks run:

- ``ProcessGroup`` (multiprocess.py): one process per rank (forks of a preloaded
  rank server on the CPU, ``torchrun`` on GPUs, or ranks started by the user's
  own launcher across nodes); the judge is this process, which never imports
  the implementation under test.
- ``ThreadGroup`` (inprocess.py): every rank a thread of this process, taking
  turns, in shardspec's lockstep group or torch's threaded backend (tp > 1 on
  one GPU); the checks then run in the implementation's process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.record import CaseResult
from shardspec.spec.case import Case
from shardspec.spec.rules import Rules

OnResult = Callable[[CaseResult], None]


@dataclass(frozen=True)
class Job:
    choice: ImplChoice
    case: Case


class Group(Protocol):
    def describe(self) -> str:
        """Where the ranks run, for the run's header."""

    def probe(self, names: list[str], rules: Rules, warnings: list[str], releases: dict[str, str]) -> dict:
        """Why each implementation named cannot be loaded (None: it loads), asked of a child process where
        this group's ranks would import it (:func:`~shardspec.conformance.harness.probe.probe`)."""

    def run(self, jobs: list[Job], tp: int, judge, on_result: OnResult) -> list[CaseResult]:
        """``jobs`` (all of group size ``tp``): one result per job, in job order, each given by ``judge`` (a
        :class:`~shardspec.conformance.judge.verdicts.Judge`, moved to the device the ranks run on)."""

    def close(self) -> None:
        """Let go of what the group keeps between group sizes (no process is left behind)."""
