"""What a checker sees and what it reports.

A run of one case on one rank yields a :class:`StepRecord`: the case, the
inputs, what the implementation under test produced at each step
(``actual``) and what the reference produced for the same rank
(``expected``). Per-rank checkers take one record; group checkers take the
per-rank digests of all ranks of a case (they may run in another process
than the ranks). Each checker is registered under exactly one invariant ID.

An unexpected exception of the implementation is reported exactly once, by the
checker of the first invariant of the step that raised (:data:`STEP_REPORTER`):
registering adds it to that checker, so a suite that runs the checkers directly
never passes a crashing implementation silently.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from shardspec.conformance.record import StepOutputs
from shardspec.spec.case import Case, CaseInputs
from shardspec.spec.documents import holds_for
from shardspec.spec.errors import declines_extensions
from shardspec.spec.loader import load_spec
from shardspec.spec.model import SamplerOutput
from shardspec.spec.rules import Rules


@dataclass
class StepRecord:
    case: Case
    rank: int
    inputs: CaseInputs
    actual: StepOutputs
    expected: StepOutputs
    # The replicated (unsharded) path's output, for INV-E2E-TRANSPARENCY.
    replicated: SamplerOutput | None = None

    @property
    def rules(self) -> Rules:
        """The rules of the case's profile: what the checkers read where the profiles differ."""
        return self.case.rules


@dataclass
class Violation:
    invariant_id: str
    message: str
    rank: int | None = None
    request: int | None = None  # batch position
    field: str | None = None

    def describe(self) -> str:
        where = [
            f"rank {self.rank}" if self.rank is not None else None,
            f"request {self.request}" if self.request is not None else None,
            f"field {self.field}" if self.field else None,
        ]
        return f"[{self.invariant_id}] {self.message} ({', '.join(w for w in where if w)})"


RankChecker = Callable[[StepRecord], Iterable[Violation]]
# digests: rank -> JSON-able dict produced by conformance's digest function.
GroupChecker = Callable[[Case, dict[int, dict[str, Any]]], Iterable[Violation]]

RANK_CHECKERS: dict[str, RankChecker] = {}
GROUP_CHECKERS: dict[str, GroupChecker] = {}
# Which records a rank checker can judge at all (default: valid inputs the reference completed, see
# outputs_expected). A report cell where no case was judgeable reads "n/a", never "pass".
APPLIES: dict[str, Callable[[StepRecord], bool]] = {}
# The same for group checkers, from the case and the ranks' digests (default: outputs_expected_of_group).
GROUP_APPLIES: dict[str, Callable[[Case, dict[int, dict[str, Any]]], bool]] = {}


def outputs_expected(record: StepRecord) -> bool:
    """A valid case whose reference run completed: what a checker of the step's outputs can judge. A case
    with ``expect_error`` (or a rank where the reference raised) has no outputs to compare."""
    return record.case.expect_error is None and record.expected.error is None


def outputs_expected_of_group(case: Case, digests: dict[int, dict[str, Any]]) -> bool:
    """A valid case that every rank completed: what a group checker of the outputs can judge."""
    return case.expect_error is None and not any(d.get("failed_step") for d in digests.values())


# The invariant whose checker reports an unexpected exception of each step:
# the first invariant of that step in spec/invariants.yaml. "construct" is
# building the sharder; "sample" is the local sampler reading the
# implementation's local batch and full-vocab rows, so an error there
# belongs to the exchange that produced those rows.
STEP_REPORTER = {
    "construct": "INV-OWNER",
    "shard": "INV-OWNER",
    "all_to_all": "INV-A2A-SPLITS",
    "sample": "INV-A2A-LAYOUT",
    "gather": "INV-WIRE-SAMPLED",
}


def declined_extensions(case: Case, outputs: StepOutputs) -> bool:
    """The implementation refused the case's extension fields (spec/errors.py, declines_extensions)."""
    return declines_extensions(case.extensions, outputs.error)


def unexpected_error(record: StepRecord, invariant_id: str) -> list[Violation]:
    """The implementation's own exception, reported under ``invariant_id`` only."""
    actual = record.actual
    if not outputs_expected(record) or actual.error is None or declined_extensions(record.case, actual):
        return []
    # A step this table does not name is reported with the shard step's.
    if STEP_REPORTER.get(actual.failed_step, STEP_REPORTER["shard"]) != invariant_id:
        return []
    message = f"raised {type(actual.error).__name__} in step {actual.failed_step}: {actual.error}"
    return [Violation(invariant_id, message, rank=record.rank)]


def _reporting_step_errors(invariant_id: str, fn: RankChecker) -> RankChecker:
    """``fn`` after the implementation's own exception, where ``invariant_id`` reports it."""

    @functools.wraps(fn)
    def checker(record: StepRecord) -> list[Violation]:
        return [*unexpected_error(record, invariant_id), *(fn(record) or ())]

    return checker


def _register(invariant_id: str, registry: dict, checker: Callable, applies_of: dict, applies: Callable) -> None:
    if invariant_id in RANK_CHECKERS or invariant_id in GROUP_CHECKERS:
        raise ValueError(f"two checkers for {invariant_id}")
    registry[invariant_id] = checker
    applies_of[invariant_id] = applies


def rank_check(invariant_id: str, applies: Callable[[StepRecord], bool] | None = None):
    def register(fn: RankChecker) -> RankChecker:
        if invariant_id in STEP_REPORTER.values():
            fn = _reporting_step_errors(invariant_id, fn)
        _register(invariant_id, RANK_CHECKERS, fn, APPLIES, outputs_expected if applies is None else applies)
        return fn

    return register


def judgeable(invariant_id: str, record: StepRecord) -> bool:
    """Whether the checker of ``invariant_id`` has something to judge in ``record`` (a checker registered
    outside :func:`rank_check` judges the outputs, as the default says)."""
    return bool(APPLIES.get(invariant_id, outputs_expected)(record))


def group_judgeable(invariant_id: str, case: Case, digests: dict[int, dict[str, Any]]) -> bool:
    return bool(GROUP_APPLIES.get(invariant_id, outputs_expected_of_group)(case, digests))


@functools.cache
def other_profiles_invariants(rules: Rules) -> frozenset[str]:
    """The IDs of the invariants that hold for other profiles only: a case under ``rules`` is not judged
    by them (n/a, never pass). From the case's rules, not its profile's name: a process the case was
    handed to (a shrinking child) knows no profile file."""
    invariants = load_spec().invariants
    return frozenset({inv.id for inv in invariants} - {inv.id for inv in invariants if holds_for(inv, rules)})


def checkers_for(registry: dict, rules: Rules) -> dict:
    """The checkers of ``registry`` but those of invariants that hold for other profiles only."""
    ids = other_profiles_invariants(rules)
    return {invariant_id: checker for invariant_id, checker in registry.items() if invariant_id not in ids}


def group_check(invariant_id: str, applies: Callable[[Case, dict[int, dict[str, Any]]], bool] | None = None):
    def register(fn: GroupChecker) -> GroupChecker:
        default = outputs_expected_of_group
        _register(invariant_id, GROUP_CHECKERS, fn, GROUP_APPLIES, default if applies is None else applies)
        return fn

    return register
