"""Owner tables of generated cases (owner rule owner_table, CL-OWNER-TABLE): how they are drawn, what a
case's table is (the variants of the input space's ``owner_table``), and how the engine carries one to
the next step.

A case writes its table as the entries that differ from the engine's initial table, slot mod tp
(``Case.owner_table``). The variants (spec/data_model.yaml, ``owner_table``'s ``variants``):

* ``initial``: every entry the batch reads is slot mod tp (no verification happened yet);
* ``by-position``: every entry the batch reads is the request's batch position mod tp (the engine
  rewrote them after a step of the same batch);
* ``mixed``: some entry the batch reads is neither its slot mod tp nor its position mod tp (a request
  that was at another position when it was last verified);
* ``stale``: an entry of a slot outside the batch outside [0, tp): never read, so never checked;
* ``idle-rank``: a rank owns nothing because of the table, although the batch has tp requests or more.

A step after another on one sharder gets the table the engine leaves: :func:`assign` rewrites the
entries of the step's requests to their batch position mod tp (vLLM's ``DraftLogitsCache.assign``). The
contract lets the engine hold the table in every form across a step (each step's owners come from that
step's table): :data:`CARRIED` names them, :func:`carried_forms` measures them from two steps, and
:func:`carried` makes a case's steps hold them.

* ``rewritten``: every entry of the step before's requests rewritten to its position then (a full assign);
* ``rewritten-in-part``: some of them rewritten, the others kept (the engine verified only some requests);
* ``kept``: the table left as it was, where a rewrite would have changed it (no verification in between).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from shardspec.spec.case import Case, owner_table_of

KINDS = ("initial", "by-position", "mixed", "one-rank")
# Values a stale entry (a slot outside the batch) holds: outside [0, tp) for every tp (tp + STALE_PAST).
STALE_BELOW, STALE_PAST = -1, 3


def draw_entries(kind: str, slots: list[int], tp: int, capacity: int, rng: np.random.Generator) -> dict | None:
    """The entries of a table of ``kind`` (KINDS) for a batch of ``slots``; None: the initial table.
    ``mixed`` also leaves a stale entry outside [0, tp) in a slot outside the batch, where there is one."""
    if kind == "initial":
        return None
    if kind == "by-position":
        return {int(s): i % tp for i, s in enumerate(slots)}
    if kind == "one-rank":
        owner = int(rng.integers(tp))
        return {int(s): owner for s in slots}
    entries = {int(s): int(rng.integers(tp)) for s in slots}
    free = [s for s in range(capacity) if s not in entries]
    if free:
        entries[int(rng.choice(free))] = int(rng.choice([STALE_BELOW, tp + STALE_PAST]))
    return entries


def engine_entries(tp: int, capacity: int, rng: np.random.Generator) -> dict:
    """Entries an engine's table may hold after some steps: about half of the slots rewritten to an owner in
    [0, tp) (a position they had), the rest still slot mod tp. Every entry is in range, whichever step
    reads it."""
    return {s: int(rng.integers(tp)) for s in range(capacity) if rng.random() < 0.5}


def variants(case: Case) -> set[str]:
    """The variants of ``owner_table`` one step of ``case`` draws (empty under another owner rule)."""
    table = owner_table_of(case)
    if table is None:
        return set()
    tp, slots = case.tp_size, case.slots
    read = [table[s] for s in slots]
    found = set()
    if read == [s % tp for s in slots]:
        found.add("initial")
    if read == [i % tp for i in range(len(slots))]:
        found.add("by-position")
    if any(owner not in (s % tp, i % tp) for i, (s, owner) in enumerate(zip(slots, read, strict=True))):
        found.add("mixed")
    batch = set(slots)
    if any(not 0 <= owner < tp for slot, owner in enumerate(table) if slot not in batch):
        found.add("stale")
    if len(slots) >= tp and len(set(read)) < tp:
        found.add("idle-rank")
    return found


def without_stale_reads(case: Case) -> Case:
    """``case`` with the entries its batch reads that lie outside [0, tp) (stale owners of slots a change of
    the batch moved a request onto) back to the initial slot mod tp, so that it stays valid."""
    entries = case.owner_table
    if not entries:
        return case
    batch = set(case.slots)
    kept = {s: o for s, o in entries.items() if s not in batch or 0 <= o < case.tp_size}
    return case if len(kept) == len(entries) else replace(case, owner_table=kept)


def assign(entries: dict | None, slots: list[int], tp: int) -> dict:
    """The entries the engine leaves after verifying a batch of ``slots``: each of the batch's entries
    rewritten to its position mod tp, the others kept (CL-OWNER-TABLE)."""
    return {**(entries or {}), **{int(s): i % tp for i, s in enumerate(slots)}}


CARRIED = ("rewritten", "rewritten-in-part", "kept")


def carried(first: Case, entries: dict | None = None, forms: tuple[str, ...] = ("rewritten",)) -> Case:
    """``first`` and its later steps with the tables the engine carries from step to step: the first step's
    ``entries`` (default: its own), then each later step's those the step before it left, in the form (CARRIED)
    ``forms`` give in turn (default: the full rewrite, :func:`assign`)."""
    entries = first.owner_table if entries is None else entries
    steps = []
    for k, step in enumerate([replace(first, then=[]), *first.then]):
        steps.append(replace(step, owner_table=None if entries is None else dict(entries)))
        entries = _carry(entries, step.slots, step.tp_size, forms[k % len(forms)])
    return replace(steps[0], then=steps[1:])


def _carry(entries: dict | None, slots: list[int], tp: int, form: str) -> dict | None:
    """The entries the engine leaves after a step of ``slots``, in ``form``: every other request (positions 0, 2,
    ...) rewritten where it rewrites in part."""
    if form == "kept":
        return entries
    if form == "rewritten-in-part":
        return {**(entries or {}), **{int(s): i % tp for i, s in enumerate(slots) if i % 2 == 0}}
    return assign(entries, slots, tp)


def carried_forms(previous: Case, case: Case) -> set[str]:
    """The form (CARRIED) in which ``case``'s table holds ``previous``'s across their step (empty under another
    owner rule, or for a table none of them gives: a step of the generator's own)."""
    before, now = owner_table_of(previous), owner_table_of(case)
    if before is None or now is None or len(before) != len(now):
        return set()
    rewrite = {int(s): i % case.tp_size for i, s in enumerate(previous.slots)}
    full = [rewrite.get(slot, owner) for slot, owner in enumerate(before)]
    if now == before:
        return {"kept"} if full != before else set()
    if now == full:
        return {"rewritten"}
    moved = [slot for slot, owner in enumerate(now) if owner != before[slot]]
    return {"rewritten-in-part"} if all(rewrite.get(slot) == now[slot] for slot in moved) else set()


# -- realizers (cases/realizers.py): a case made to draw a variant --------------------------------------


def realizer(variant: str):
    """A change of a toy-sampled case (explicit outputs are written for its owners) that draws ``variant``."""

    def realize(case: Case, rng: np.random.Generator):
        if owner_table_of(case) is None or case.local_outputs != "toy":
            return None
        tp, slots = case.tp_size, case.slots
        if variant == "stale":
            free = [s for s in range(case.max_num_reqs) if s not in slots]
            if not free:
                return None
            return replace(case, owner_table={**(case.owner_table or {}), int(rng.choice(free)): tp + STALE_PAST})
        if variant == "initial":
            kept = {s: o for s, o in (case.owner_table or {}).items() if s not in slots}
            return replace(case, owner_table=kept or None)
        if variant == "idle-rank":
            if tp < 2 or len(slots) < tp:
                return None
            kind = "one-rank"
        else:
            kind = variant
            if variant == "mixed" and tp < 2:
                return None
        stale = {s: o for s, o in (case.owner_table or {}).items() if s not in slots}
        drawn = draw_entries(kind, slots, tp, case.max_num_reqs, rng) or {}
        changed = replace(case, owner_table={**stale, **drawn})
        return changed if variant in variants(changed) else None

    return realize
