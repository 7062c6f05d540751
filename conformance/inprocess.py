"""Run cases with every rank as a thread of this process, one rank at a time.

For fixture replay and shrinking without launching processes. Only for
implementations that talk through the Communicator they are given (pure
torch, or Triton under ``TRITON_INTERPRET=1``: ranks never run concurrently).
A rank that hangs cannot be interrupted here; use the multi-process runner.
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
from shardspec.spec.case import Case


def run_case_in_process(case: Case, choice: ImplChoice, expectation: Optional[Expectation] = None,
                        timeout_s: float = 60.0) -> CaseResult:
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
            records = run_lockstep(LockstepGroup(case.tp_size, timeout_s=timeout_s), one_rank)
    except TimeoutError as exc:
        return combine(case, choice.label, {}, ended=f"in-process run failed: {exc}")
    return combine(case, choice.label, dict(enumerate(records)))


def run_jobs_in_process(jobs: Iterable, timeout_s: float = 60.0,
                        on_result: Optional[Callable[[CaseResult], None]] = None) -> list[CaseResult]:
    """Run :class:`shardspec.conformance.launcher.Job` s one after the other."""
    results = []
    for job in jobs:
        result = run_case_in_process(job.case, job.choice, timeout_s=timeout_s)
        results.append(result)
        if on_result:
            on_result(result)
    return results
