"""Run cases with every rank as a thread of this process, one rank at a time.

For fixture replay and shrinking without launching processes, and for tp > 1
on one GPU. Two groups: ``lockstep`` (:class:`shardspec.comm.LockstepGroup`),
for implementations that talk only through the Communicator they are given;
``torch-threads`` (:mod:`shardspec.conformance.threaded`), a torch.distributed
group, also for implementations that call torch.distributed themselves. In
both, ranks never run concurrently, so the Triton interpreter works. A rank
that hangs outside a collective cannot be interrupted here; use the
multi-process runner.
"""

from __future__ import annotations

import traceback
from typing import Callable, Iterable, Optional

from shardspec.comm import LockstepGroup
from shardspec.conformance.api import ImplChoice, load_implementation
from shardspec.conformance.execute import check_case_on_rank
from shardspec.conformance.expectations import Expectation, compute_expectation, expectation_device, single_thread
from shardspec.conformance.recording import run_lockstep
from shardspec.conformance.results import CaseResult, combine
from shardspec.conformance.threaded import run_torch_threads
from shardspec.spec.case import Case


def run_case_in_process(case: Case, choice: ImplChoice, expectation: Optional[Expectation] = None,
                        timeout_s: float = 60.0, group: str = "lockstep") -> CaseResult:
    expectation = expectation or compute_expectation(case, timeout_s, expectation_device())
    impls = {name: load_implementation(name) for name in {choice.impl, choice.impl_odd} if name}

    def one_rank(comm):
        impl = impls[choice.for_rank(comm.rank)]
        try:
            return check_case_on_rank(case, comm, impl.name, impl.factory, expectation, expectation_device())
        except Exception:  # outside the implementation's calls (e.g. a device error surfacing in a checker)
            return {"harness_error": traceback.format_exc()}

    try:
        with single_thread():  # like the ranks of a multi-process run, and the expectation
            if group == "torch-threads":
                records = run_torch_threads(case.tp_size, one_rank, timeout_s)
            else:
                records = run_lockstep(LockstepGroup(case.tp_size, timeout_s=timeout_s), one_rank)
    except TimeoutError as exc:
        return combine(case, choice.label, {}, ended=f"in-process run failed: {exc}")
    return combine(case, choice.label, dict(enumerate(records)))


def run_jobs_in_process(jobs: Iterable, timeout_s: float = 60.0,
                        on_result: Optional[Callable[[CaseResult], None]] = None,
                        group: str = "lockstep") -> list[CaseResult]:
    """Run :class:`shardspec.conformance.launcher.Job` s one after the other."""
    results = []
    for job in jobs:
        result = run_case_in_process(job.case, job.choice, timeout_s=timeout_s, group=group)
        results.append(result)
        if on_result:
            on_result(result)
    return results
