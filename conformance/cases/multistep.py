"""Multi-step cases: one sharder instance called for several consecutive steps, as an engine calls it.

State and workspace reuse are where an implementation can go wrong only on a
later step: a plan cached by batch size, a buffer sized by the first batch, a
view into last step's output. Each multi-step case starts from a generated
case and then changes the batch the way engines do: the same number of
requests in other slots, fewer requests, more requests (up to the capacity),
a decode loop on those (:func:`decode_loop`: the same requests step after step, one field changed each
time), and the first shape again; under an owner table the engine's table is carried from step to step
(:func:`under_profile`). The step's options change too, as the input space
says an engine may change them between steps (conformance/cases/input_space.py,
axis ``step``): the grammar output comes and goes, NaN counts and logprobs are
asked for on some steps only, and the last step declares an extension field. A
sharder that keeps a width, a flag or a buffer from an earlier step fails
there. Every step is judged on its own (``<case id>.step<k>``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from shardspec.conformance.cases import owner_tables
from shardspec.conformance.cases.realizers import EXTENSION
from shardspec.spec.case import Case
from shardspec.spec.model import DEFAULT_PROFILE
from shardspec.spec.profiles import root_profile, rules_of

STEP_KINDS = ("other-slots", "shrink", "grow", "repeat")


def multi_step_cases(tp_size: int, count: int, seed: int, profile: str | None = None) -> list[Case]:
    """``count`` multi-step cases for ``tp_size``; the same for the same seed. ``profile``: judged under it
    (None: the root profile's), with, under owner rule owner_table, the owner tables the engine carries
    from step to step (:func:`under_profile`)."""
    from shardspec.conformance.cases.strategies import generate_cases

    # Bases under the root profile, without a later release's per-request inputs: the later steps are
    # derived from the first's fields.
    base = root_profile(DEFAULT_PROFILE)
    bases = [c for c in generate_cases(tp_size, count * 2 + 8, seed + 7919, base, fill_gaps=False) if _usable(c)]
    bases = bases[:count]
    cases = []
    for number, base in enumerate(bases):
        rng = np.random.default_rng([seed, tp_size, number, 17])
        case = with_steps(base, rng)
        case.case_id = f"multi-tp{tp_size}-s{seed}-{number:03d}"
        if profile is not None:
            case = under_profile(case, profile, np.random.default_rng([seed, tp_size, number, 29]))
        cases.append(case)
    return cases


def under_profile(case: Case, profile: str, rng: np.random.Generator) -> Case:
    """``case`` and its steps under ``profile``. Under owner rule owner_table the first step's table is one
    an engine may hold after some steps and each later step's is the one the engine leaves after the step
    before it (its requests' entries rewritten to their batch positions mod tp: CL-OWNER-TABLE), so later
    steps' owners differ from what the first step's table gives their slots."""
    steps = [replace(step, profile=profile) for step in case.then]
    case = replace(case, profile=profile, then=steps)
    if not rules_of(profile).owner_by_table:
        return case
    return owner_tables.carried(case, owner_tables.engine_entries(case.tp_size, case.max_num_reqs, rng))


def _usable(case: Case) -> bool:
    """A valid first step whose later steps can be derived (no rejection, no edits of the inputs), on a
    sharder whose requests may change their rows (the decode loop's drafts)."""
    return case.expect_error is None and not case.edits and len(case.slots) > 0 and case.max_num_logits_per_req > 1


def with_steps(base: Case, rng: np.random.Generator) -> Case:
    first = replace(base, local_outputs="toy", nan_tokens=[], description="multi-step: first step")
    steps, previous = [], first
    for k, kind in enumerate(STEP_KINDS, start=1):
        slots = _slots(kind, first, previous, rng)
        step = _step(first, slots, rng, seed=base.seed + k, description=f"multi-step: {kind}")
        steps.append(replace(step, **_options(kind, first, previous, slots)))
        if kind == "grow":  # the most requests of any step (at least two): the decode loop's
            steps += decode_loop(steps[-1], rng, seed=base.seed + 100)
        previous = steps[-1]
    first.then = steps
    return first


# A decode loop: the step before's requests again, in the same slots, each step with one thing changed
# (or none), as an engine's consecutive steps have them. A sharder that keys something it kept on the
# requests (a plan, a width, the local batch) and reuses it where one field moved fails there.
LOOP_KINDS = ("seq-lens", "drafts", "grammar-joins", "logprobs", "nan-counts", "extensions", "order", "same")


def decode_loop(previous: Case, rng: np.random.Generator, seed: int) -> list[Case]:
    steps = []
    for k, kind in enumerate(LOOP_KINDS):
        step = replace(previous, seed=seed + k, description=f"multi-step: same requests, {kind}", then=[])
        changed = _loop_change(kind, step, rng)
        if changed is not None:
            steps.append(replace(step, **changed))
            previous = steps[-1]
    return steps


def _loop_change(kind: str, step: Case, rng: np.random.Generator) -> dict | None:
    """The one change of ``kind`` to the step before (None where it cannot change: one row per request at
    most, a single request to reorder)."""
    n = len(step.slots)
    if kind == "seq-lens":
        return {"seq_lens_growth": step.seq_lens_growth + 1}
    if kind == "drafts":
        if step.max_num_logits_per_req == 1:
            return None
        counts = list(step.num_logits_per_req)
        i = int(rng.integers(n))
        counts[i] = counts[i] % step.max_num_logits_per_req + 1  # another count in [1, max]
        return {"num_logits_per_req": counts, "spec_decode": None}
    if kind == "grammar-joins":
        listed = list(step.grammar_positions or [])
        left = [p for p in range(n) if p not in listed]
        return {"grammar_positions": [*listed, left[0]]} if left else {"grammar_positions": None}
    if kind == "logprobs":
        return {"logprobs_dims": None if step.logprobs_dims is not None else (1, 2)}
    if kind == "nan-counts":
        return {"gather_num_nans": not step.gather_num_nans}
    if kind == "extensions":
        return {"extensions": {} if step.extensions else dict(EXTENSION)}
    if kind == "order":
        return None if n < 2 else _reordered(step)
    return {}  # same: nothing changed


def _reordered(step: Case) -> dict:
    """The same requests one batch position later each (the last first); the grammar follows its requests."""
    last = len(step.slots) - 1
    order = [last, *range(last)]
    where = {old: new for new, old in enumerate(order)}
    grammar = None if step.grammar_positions is None else [where[p] for p in step.grammar_positions]
    return {
        "slots": [step.slots[i] for i in order],
        "num_logits_per_req": [step.num_logits_per_req[i] for i in order],
        "grammar_positions": grammar,
    }


def _slots(kind: str, first: Case, previous: Case, rng: np.random.Generator) -> list[int]:
    capacity, n = first.max_num_reqs, len(previous.slots)
    if kind == "other-slots":
        return [int(s) for s in rng.choice(capacity, size=n, replace=False)]
    if kind == "shrink":
        return list(previous.slots[: max(1, n // 2)])
    if kind == "grow":
        free = [s for s in range(capacity) if s not in previous.slots]
        extra = [int(s) for s in rng.permutation(free)[: max(1, n)]]
        return list(previous.slots) + extra
    return [int(s) for s in rng.choice(capacity, size=len(first.slots), replace=False)]  # repeat


def _options(kind: str, first: Case, previous: Case, slots: list[int]) -> dict:
    """What changes besides the batch: the grammar output on the other-slots step (none where the step
    before had one, else every other request), NaN counts on the shrink step, logprobs on the grow
    step (none where the step before had them, else (1, 2)), an extension field on the repeat step."""
    if kind == "other-slots":
        return {"grammar_positions": None if previous.grammar_positions else list(range(0, len(slots), 2))}
    if kind == "shrink":
        return {"gather_num_nans": not previous.gather_num_nans}
    if kind == "grow":
        return {"logprobs_dims": None if previous.logprobs_dims is not None else (1, 2)}
    return {"extensions": {**first.extensions, **EXTENSION}}


def _step(first: Case, slots: list[int], rng: np.random.Generator, seed: int, description: str) -> Case:
    counts = [int(c) for c in rng.integers(1, first.max_num_logits_per_req + 1, size=len(slots))]
    grammar = None if first.grammar_positions is None else list(range(0, len(slots), 2))
    return replace(
        first,
        slots=slots,
        num_logits_per_req=counts,
        spec_decode=None,
        grammar_positions=grammar,
        seed=seed,
        nan_tokens=[],
        local_outputs="toy",
        description=description,
        then=[],
    )
