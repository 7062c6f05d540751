"""One rank's record of one case, judged: the rank checkers, then the digest the group checkers read.

A checker that raises never ends the run and never passes silently: it is a
violation of its invariant naming the exception (the one crash policy, for
complete and partial steps alike). Of a rank that died mid-step only the
invariants of the steps it finished are asked. A checker with nothing to
look at in a record is asked all the same; ``judged`` leaves it out.
"""

from __future__ import annotations

import functools
import time
import traceback
from typing import Any

from shardspec.conformance.judge.checks.base import (
    GROUP_CHECKERS,
    RANK_CHECKERS,
    StepRecord,
    Violation,
    checkers_for,
    declined_extensions,
    judgeable,
)
from shardspec.conformance.judge.digest import logprob_rows, step_digest
from shardspec.conformance.record import STEP_OUTPUT, Expectation, StepOutputs
from shardspec.spec.case import Case, CaseInputs
from shardspec.spec.loader import load_spec


def should_check(case: Case, outputs: StepOutputs) -> bool:
    """Checkers judge complete steps, expected rejections and declined extension fields; other errors
    fail the case as errors."""
    return outputs.error is None or case.expect_error is not None or declined_extensions(case, outputs)


def guarded(invariant_id: str, rank: int | None, call) -> list[Violation]:
    """Run a checker; one that crashes reports a violation of its invariant instead of ending the run."""
    try:
        return list(call() or ())
    except Exception as exc:
        where = traceback.format_exc(limit=-2)
        return [Violation(invariant_id, f"checker raised {type(exc).__name__}: {exc}\n{where}", rank=rank)]


def rank_checks(record: StepRecord, steps: set[str] | None = None) -> tuple[list[Violation], list[str]]:
    """The violations the rank checkers find in ``record`` and the invariants they could judge; only those
    of ``steps`` when given (a rank that did not finish every step)."""
    of_step = invariant_steps()
    violations: list[Violation] = []
    judged: list[str] = []
    for invariant_id, checker in checkers_for(RANK_CHECKERS, record.case.rules).items():
        if steps is not None and of_step.get(invariant_id) not in steps:
            continue
        # Asked even where it has nothing to look at: only what it finds decides, never the filter.
        violations.extend(guarded(invariant_id, record.rank, functools.partial(checker, record)))
        if judgeable(invariant_id, record):
            judged.append(invariant_id)
    return violations, judged


def group_checks(case: Case, digests: dict[int, dict[str, Any]]) -> list[Violation]:
    violations: list[Violation] = []
    for invariant_id, checker in checkers_for(GROUP_CHECKERS, case.rules).items():
        violations.extend(guarded(invariant_id, None, functools.partial(checker, case, digests)))
    return violations


def judge_rank(
    case: Case,
    record: dict[str, Any],
    expectation: Expectation,
    inputs: CaseInputs,
    completed: set[str] | None = None,
) -> dict[str, Any]:
    """``record`` with its ``outputs`` judged: ``violations`` and the group checkers' ``digest`` instead.

    ``completed``: the steps a rank that died mid-step finished; only
    invariants of those steps are judged then (the rest cannot be).
    """
    record = dict(record)
    if case.expect_error is not None and record.get("error"):  # the rank does not know; its rejection, judged
        record["rejection"], record["error"] = record["error"], None
    outputs: StepOutputs = record.pop("outputs")
    rank = record["rank"]
    start = time.perf_counter()
    step_record = StepRecord(
        case=case,
        rank=rank,
        inputs=inputs,
        actual=outputs,
        expected=expectation.expected[rank],
        replicated=expectation.replicated,
    )
    if completed is None and not should_check(case, outputs):
        completed = returned_steps(outputs)  # judge what the steps before the error returned
    violations, judged = rank_checks(step_record, completed)
    record["judged"] = judged if completed is None else []
    record["timings"] = {**record.get("timings", {}), "checks": round(time.perf_counter() - start, 6)}
    record["violations"] = [violation_dict(v) for v in violations]
    record["digest"] = step_digest(
        outputs,
        rank=rank,
        impl=record["impl"],
        error_in_collective=record.get("error_in_collective", False),
        logprob_rows=logprob_rows(case, inputs.batch),
    )
    return record


def returned_steps(outputs: StepOutputs) -> set[str]:
    """The steps whose results ``outputs`` holds (the sample step's result is the gather's input)."""
    return {step for step, name in STEP_OUTPUT.items() if step != "sample" and getattr(outputs, name) is not None}


@functools.lru_cache(maxsize=1)
def invariant_steps() -> dict[str, str]:
    return {inv.id: inv.step for inv in load_spec().invariants}


def violation_dict(v: Violation) -> dict[str, Any]:
    return {
        "invariant_id": v.invariant_id,
        "message": v.message,
        "rank": v.rank,
        "request": v.request,
        "field": v.field,
    }
