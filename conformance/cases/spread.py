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


def most_drawing(pool: list[Case], count: int, fixtures: list[Case]) -> list[Case]:
    """The ``count`` cases of ``pool`` that draw the most beyond ``fixtures``, in pool order."""
    if count >= len(pool):
        return pool
    return [pool[i] for i in best_spread([[c] for c in pool], count, drawn(fixtures))]


def chosen_for_few(
    cases: list[Case], generated: set[str], parent_of: dict[str, str], made: set[str], count: int
) -> set[str]:
    """Per size, the ids of ``count`` generated cases and of one multi-step case's steps (``parent_of``:
    step id -> its case's id) that draw the most beyond the cases not ``made`` by the run (the fixtures)."""
    chosen: set[str] = set()
    for tp in sorted({c.tp_size for c in cases}):
        at_tp = [c for c in cases if c.tp_size == tp]
        covered = drawn(c for c in at_tp if c.case_id not in made)
        multi: dict[str, list[Case]] = {}
        for case in at_tp:
            if case.case_id in parent_of:
                multi.setdefault(parent_of[case.case_id], []).append(case)
        for picked in best_spread(list(multi.values()), 1, covered):
            steps = list(multi.values())[picked]
            chosen |= {c.case_id for c in steps}
            covered |= drawn(steps)
        single = [[c] for c in at_tp if c.case_id in generated]
        chosen |= {single[i][0].case_id for i in best_spread(single, count, covered)}
    return chosen
