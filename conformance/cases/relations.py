"""Relations between the slots (idx_mapping) and the batch positions, drawn on purpose: the variants of the input
space's ``batch.idx_mapping`` (spec/data_model.yaml, ``variants``), how a case's slots are measured against them,
and how a case is made to draw one (cases/realizers.py).

* ``identical``: the slot of every request is its batch position (0 .. N-1 in batch order);
* ``reversed``: the slots are the batch positions backwards (N-1 .. 0);
* ``permuted``: the batch positions permuted, the first and the last in place (N >= 4);
* ``gaps``: the slots rise with the batch positions but skip some (not N consecutive slots);
* ``above-n``: every slot is N or more.

Random slots draw the last two often and the first three almost never (at most with two requests). An
implementation that takes a short cut where slots and positions look alike (the same, mirrored, equal at the
ends, consecutive, numbered from elsewhere) is right on every other batch.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from shardspec.spec.builders import default_query_lens
from shardspec.spec.case import Case, case_owners

RELATIONS = ("identical", "reversed", "permuted", "gaps", "above-n")


def relations(slots: list[int]) -> set[str]:
    """The relations ``slots`` have with their batch positions (two requests at least, one for ``above-n``)."""
    n = len(slots)
    if n == 0:
        return set()
    found = {"above-n"} if min(slots) >= n else set()
    if n < 2:
        return found
    positions = list(range(n))
    if slots == positions:
        found.add("identical")
    if slots == positions[::-1]:
        found.add("reversed")
    if n >= 4 and sorted(slots) == positions and (slots[0], slots[-1]) == (0, n - 1) and slots != positions:
        found.add("permuted")
    if all(a < b for a, b in zip(slots, slots[1:], strict=False)) and slots[-1] - slots[0] >= n:
        found.add("gaps")
    return found


def _slots(relation: str, n: int, capacity: int, rng: np.random.Generator) -> list[int] | None:
    """``n`` slots below ``capacity`` with ``relation`` (None where none exist)."""
    positions = list(range(n))
    if relation == "identical":
        return positions if n >= 2 else None
    if relation == "reversed":
        return positions[::-1] if n >= 2 else None
    if relation == "permuted":
        if n < 4:
            return None
        middle = positions[1:-1]
        moved = middle[1:] + middle[:1]  # a rotation: never the identity
        return [0, *moved, n - 1]
    if relation == "gaps":
        if n < 2 or capacity <= n:
            return None
        chosen = sorted(int(s) for s in rng.choice(capacity, size=n, replace=False))
        if chosen[-1] - chosen[0] < n:  # consecutive: move the last one up past a gap
            chosen[-1] = chosen[-1] + 1 if chosen[-1] + 1 < capacity else chosen[-1]
            if chosen[-1] - chosen[0] < n:
                chosen[0] -= 1
        return chosen
    if capacity < 2 * n:  # above-n
        return None
    return [int(s) for s in rng.choice(np.arange(n, capacity), size=n, replace=False)]


def realizer(relation: str):
    """A change of a case's slots that draws ``relation``; None where its capacity cannot hold them or where the
    owners would change under explicit local outputs (written for the owners the case had)."""

    def realize(case: Case, rng: np.random.Generator):
        slots = _slots(relation, len(case.slots), case.max_num_reqs, rng)
        if slots is None:
            return None
        if slots == case.slots:
            return case
        changed = replace(case, slots=slots)
        if case.local_outputs != "toy" and case_owners(changed) != case_owners(case):
            return None
        tokens = int(default_query_lens(slots, case.num_logits_per_req).sum())
        return replace(changed, nan_tokens=[t for t in case.nan_tokens if t < tokens])

    return realize
