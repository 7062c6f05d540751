"""Choosing a few cases that draw as much of the input space as many do (cases/coverage.py).

An entry that runs fewer generated cases than the others (a mixed entry A/B) should not run the first
few: it should run those that draw what the cases it runs anyway (the fixtures) do not. The choice is
greedy (each pick draws the most variations not drawn yet; ties go to the earlier case), which is
deterministic for a seed and close to the best a set cover can do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shardspec.conformance.cases.coverage import exercised, steps_of
from shardspec.conformance.cases.input_space import Variation
from shardspec.spec.case import Case


def drawn(cases: Iterable[Case]) -> set[Variation]:
    """The variations the valid steps of ``cases`` draw (a step continuing another is paired with it)."""
    return {v for step, previous in steps_of(cases) if step.expect_error is None for v in exercised(step, previous)}


def best_spread(candidates: Sequence[Sequence[Case]], count: int, already: set[Variation]) -> list[int]:
    """The indices of ``count`` candidates, in their order, chosen to draw the most variations beyond
    ``already``; each candidate is the cases that run together (one case, or the steps of a multi-step
    case). Once no candidate draws anything new, the earliest of the rest fill the count."""
    draws = [drawn(candidate) for candidate in candidates]
    covered = set(already)
    chosen: list[int] = []
    left = list(range(len(candidates)))
    while left and len(chosen) < count:
        best = max(left, key=lambda i: (len(draws[i] - covered), -i))
        if not draws[best] - covered:
            break
        chosen.append(best)
        covered |= draws[best]
        left.remove(best)
    chosen += left[: count - len(chosen)]
    return sorted(chosen)
