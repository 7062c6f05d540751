"""Run cases with every rank as a thread of this process, one rank at a time.

For fixture replay and shrinking without launching processes, and for tp > 1
on one GPU. Two groups: ``lockstep`` (:class:`shardspec.comm.LockstepGroup`),
for implementations that talk only through the Communicator they are given;
``torch-threads`` (:mod:`shardspec.conformance.harness.threaded`), a torch.distributed
group, also for implementations that call torch.distributed themselves. In
both, ranks never run concurrently, so the Triton interpreter works. A rank
that hangs outside a collective cannot be interrupted here; use the
multi-process runner.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from shardspec.comm import LockstepGroup
from shardspec.conformance.api import ImplChoice, load_implementation
from shardspec.conformance.harness.crashes import CrashBudget, invalid_input
from shardspec.conformance.harness.expectations import expectation_device, single_thread
from shardspec.conformance.harness.group import Job, OnResult
from shardspec.conformance.harness.probe import probe
from shardspec.conformance.harness.rank_plan import plan_of
from shardspec.conformance.harness.rank_step import run_case_on_rank
from shardspec.conformance.harness.threaded import run_torch_threads
from shardspec.conformance.record import ERROR, FAIL, NOT_RUN, PASS, CaseResult, not_run
from shardspec.spec.case import Case, expand_steps
from shardspec.spec.rules import Rules


def run_case_in_process(
    case: Case, choice: ImplChoice, judge, timeout_s: float = 60.0, group: str = "lockstep", device: str = "auto"
) -> CaseResult:
    """One case; the steps of a multi-step case make one result whose violations and errors name their step.
    ``judge``: a :class:`~shardspec.conformance.judge.verdicts.Judge` (any device: this group moves it)."""
    if case.then:
        return merged_steps(case, run_steps_in_process(expand_steps(case), choice, judge, timeout_s, group, device))
    return run_steps_in_process([case], choice, judge, timeout_s, group, device)[0]


def merged_steps(case: Case, results: list[CaseResult]) -> CaseResult:
    order = {PASS: 0, FAIL: 1, ERROR: 2, NOT_RUN: 3}
    merged = CaseResult(case=case, impl=results[0].impl, status=max((r.status for r in results), key=order.get))
    for result in results:
        merged.violations += [{**v, "step_case": result.case_id} for v in result.violations]
        merged.errors += [{**e, "step_case": result.case_id} for e in result.errors]
    merged.judged = sorted({i for r in results for i in r.judged})
    return merged


def run_steps_in_process(
    cases: list[Case], choice: ImplChoice, judge, timeout_s: float = 60.0, group: str = "lockstep", device: str = "auto"
) -> list[CaseResult]:
    """``cases`` in one group, each rank calling one sharder for all of them (the steps of a multi-step
    case; a single case is one step); a result per case. ``device``: ``--in-process-device``. Each rank's
    record is judged in its own thread as soon as its case ends (the judge runs in this process)."""
    device = expectation_device(device)
    judge = judge.at(device)
    plans = [plan_of(c, judge.expectation(c)) for c in cases]
    impls = {name: load_implementation(name) for name in {choice.impl, choice.impl_odd} if name}

    def one_rank(comm):
        impl, kept, records = impls[choice.for_rank(comm.rank)], None, []
        for case, plan in zip(cases, plans, strict=False):
            try:
                record, kept = run_case_on_rank(case, comm, impl.name, impl.factory, plan, device, kept=kept)
                record = judge.rank(case, record)
            except Exception:  # outside the implementation's calls (e.g. a device error surfacing in a checker)
                records.append({"harness_error": traceback.format_exc()})
                break
            records.append(record)
            if not record["aligned"]:
                break
        return records

    try:
        with single_thread():  # like the ranks of a multi-process run, and the expectation
            if group == "torch-threads":
                per_rank = run_torch_threads(cases[0].tp_size, one_rank, timeout_s)
            else:
                per_rank = LockstepGroup(cases[0].tp_size, timeout_s=timeout_s).run(one_rank, partial=True)
    except TimeoutError as exc:
        return [judge.case(case, choice.label, {}, ended=f"in-process run failed: {exc}") for case in cases]
    return [
        judge.case(
            case,
            choice.label,
            {rank: records[k] for rank, records in enumerate(per_rank) if records and k < len(records)},
        )
        for k, case in enumerate(cases)
    ]


def run_jobs_in_process(
    jobs: Iterable,
    judge,
    timeout_s: float = 60.0,
    on_result: Callable[[CaseResult], None] | None = None,
    group: str = "lockstep",
    device: str = "auto",
    max_crashes: int = 0,
    tp: int | None = None,
) -> list[CaseResult]:
    """Run :class:`shardspec.conformance.harness.group.Job` s one after the other; the steps of a multi-step
    case (consecutive jobs, each continuing the one before) share one group and one sharder per rank. After
    ``max_crashes`` cases of an entry whose constructor raised alike, its other jobs are not run
    (harness/crashes.py; 0: every job runs)."""
    results = []
    crashes = CrashBudget(max_crashes)
    for chain in _chains(list(jobs)):
        choice = chain[0].choice
        reason = crashes.spent(
            choice.label, tp if tp is not None else chain[0].case.tp_size, invalid_input(chain[0].case)
        )
        if reason is not None:
            chain_results = [not_run(job.case, choice.label, reason) for job in chain]
        else:
            chain_results = run_steps_in_process([job.case for job in chain], choice, judge, timeout_s, group, device)
        for result in chain_results:
            crashes.note(result)
            results.append(result)
            if on_result:
                on_result(result)
    return results


def _chains(jobs: list) -> list[list]:
    chains: list[list] = []
    for job in jobs:
        previous = chains[-1][-1] if chains else None
        if previous is not None and job.case.continues == previous.case.case_id and job.choice == previous.choice:
            chains[-1].append(job)
        else:
            chains.append([job])
    return chains


@dataclass
class ThreadGroup:
    kind: str = "lockstep"  # one of run/options.py's THREAD_GROUPS
    device: str = "auto"  # auto | cpu | cuda
    pg_timeout_s: float = 60.0
    max_crashes: int = 3  # see harness/crashes.py (here: constructors that fail alike)

    def describe(self) -> str:
        return f"in-process ({self.kind} group, ranks as threads on {expectation_device(self.device)})"

    def probe(self, names: list[str], rules: Rules, warnings: list[str], releases: dict[str, str]) -> dict:
        return probe(names, rules, warnings=warnings, releases=releases)

    def run(self, jobs: list[Job], tp: int, judge, on_result: OnResult) -> list[CaseResult]:
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
