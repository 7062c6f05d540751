"""What a rank of a multi-process run is told of a case: how to build its inputs, never the verdict's terms.

The ranks run the implementation, so whatever they hold, it can read (from
the suite's objects on its stack, say). They get each case under an opaque
name (``case<k>``), without its description, spec references or expected
error, and instead of the reference's expectation only a :class:`RankPlan`:
where each rank must have raised, for the suite to stop one that goes on
(:mod:`.past_rejection`), and whether its group can go on after an error.
The precondition a must-reject case violates, and the reference's error,
stay in the judge's process; the judge sorts a rank's error into a
rejection there. What a rank can still learn: that it must raise, and where
(its plan), and the case's named edits, from which the suite's own tables
lead to the precondition.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, replace

from shardspec.conformance.harness.past_rejection import RejectionPoint, rejection_point
from shardspec.spec.case import Case

OPAQUE = "case"  # a rank's name of the case at position k of a run's cases: case<k>


@dataclass(frozen=True)
class RankPlan:
    # Per rank: the step in which the reference raises on a case that must be rejected, and after how many
    # collectives (the rank is stopped if it goes further); None: it is never stopped.
    stops: tuple[tuple[str, int] | None, ...]
    # Every rank of the reference raises after this many collectives: a rank that raised after as many (not
    # inside a collective) leaves its group aligned. None: an error leaves the group.
    aligned_wire: int | None

    def rejection_point(self, rank: int) -> RejectionPoint:
        stop = self.stops[rank]
        return RejectionPoint(None) if stop is None else RejectionPoint(stop[0], stop[1])


def plan_of(case: Case, expectation) -> RankPlan:
    """The plan of ``case`` from the reference's ``expectation`` (in the judge's process)."""
    expected = expectation.expected
    stops = []
    for out in expected:
        point = rejection_point(case, out)
        stops.append(None if point.step is None else (point.step, point.collectives))
    wires = {len(out.wire) for out in expected}
    raises_alike = case.expect_error is not None and all(out.error is not None for out in expected)
    return RankPlan(tuple(stops), wires.pop() if raises_alike and len(wires) == 1 else None)


def blinded(cases: list[Case]) -> list[Case]:
    """``cases`` as ranks get them: named ``case<k>`` (a step's ``continues`` renamed alike), with no
    description, spec references or expected error."""
    names = {case.case_id: f"{OPAQUE}{k}" for k, case in enumerate(cases)}
    return [
        replace(
            case,
            case_id=names[case.case_id],
            continues=names.get(case.continues) if case.continues else None,
            description="",
            spec_refs=[],
            expect_error=None,
            then=[],
        )
        for case in cases
    ]


def real_names(cases: list[Case]) -> dict[str, str]:
    """Each opaque name of :func:`blinded` to the case's own id (for what a rank reports by name)."""
    return {f"{OPAQUE}{k}": case.case_id for k, case in enumerate(cases)}


def save_plans(path: pathlib.Path, plans: list[RankPlan]) -> None:
    path.write_text(json.dumps([{"stops": plan.stops, "aligned_wire": plan.aligned_wire} for plan in plans]))


def load_plans(path: pathlib.Path) -> list[RankPlan]:
    return [
        RankPlan(tuple(None if stop is None else (stop[0], stop[1]) for stop in row["stops"]), row["aligned_wire"])
        for row in json.loads(path.read_text())
    ]
