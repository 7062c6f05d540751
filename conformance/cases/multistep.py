"""Multi-step cases: one sharder instance called for several consecutive steps, as an engine calls it.

State and workspace reuse are where an implementation can go wrong only on a later step: a plan cached by
batch size, a buffer sized by the first batch, a view into last step's output. Each multi-step case starts
from a case generated under the run's profile (its callers' inputs, never another profile's) and then changes
the batch the way engines do: the same number of requests in other slots, fewer requests, more requests (up to
the capacity), a decode loop on those (:func:`decode_loop`: the same requests step after step, one field
changed each time), and the first shape again; under an owner table the engine's table is carried from step to
step (:func:`with_tables`). The step's options change too, as the input space says an engine may change them
between steps (conformance/cases/input_space.py, axis ``step``): the grammar output comes and goes, NaN counts
and logprobs are asked for on some steps only, and the last step declares an extension field. A sharder that
keeps a width, a flag or a buffer from an earlier step fails there. Every step draws the inputs the run's
profile adds (cases/profile_inputs.py: admitted draft counts, grammar blocks, batch dtypes), with the
sharder's adaptive verification fixed for all of them (on for every other case where the profile has it), the
repeat step every batch field in the other dtype than the first's; the decode loop keeps them consistent with
the step's requests and changes the admitted counts on a step of their own, and where the profile's engine may
leave the bound of seq_lens out, leaves it out on a step of its own. Every step is judged on its own (``<case
id>.step<k>``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from shardspec.conformance.cases import owner_tables
from shardspec.conformance.cases.profile_inputs import flipped_dtypes, with_profile_inputs, without_profile_inputs
from shardspec.conformance.cases.realizers import EXTENSION
from shardspec.conformance.cases.strategies import generate_cases
from shardspec.spec.case import Case
from shardspec.spec.case_edits import UPPER_BOUND_ABSENT
from shardspec.spec.guarantees import CONTIGUOUS_LAYOUTS
from shardspec.spec.profiles import default_rules
from shardspec.spec.rules import Rules

STEP_KINDS = ("other-slots", "shrink", "grow", "repeat")


def multi_step_cases(tp_size: int, count: int, seed: int, rules: Rules | None = None) -> list[Case]:
    """``count`` multi-step cases for ``tp_size`` under ``rules`` (the default profile's if None); the same for
    the same seed. Under owner rule owner_table they carry the owner tables the engine carries from step to
    step (:func:`with_tables`)."""
    rules = rules or default_rules()
    # Bases drawn under the profile itself, as its callers send them; every step then draws the profile's
    # per-step inputs afresh (with_steps).
    bases = [c for c in generate_cases(tp_size, count * 2 + 8, seed + 7919, rules, fill_gaps=False) if _usable(c)]
    bases = bases[:count]
    cases = []
    for number, base in enumerate(bases):
        rng = np.random.default_rng([seed, tp_size, number, 17])
        case = with_steps(replace(base, rules=rules), rng, adaptive=rules.adaptive and number % 2 == 0)
        case.case_id = f"multi-tp{tp_size}-s{seed}-{number:03d}"
        if rules.owner_by_table:
            case = with_tables(case, np.random.default_rng([seed, tp_size, number, 29]))
        cases.append(case)
    return cases


# The forms in which the engine carries its table across the steps of a multi-step case, in turn.
CARRIED_IN_TURN = ("rewritten", "rewritten-in-part", "rewritten", "kept")


def with_tables(case: Case, rng: np.random.Generator) -> Case:
    """``case`` with owner tables: the first step's is one an engine may hold after some steps and each later
    step's is the one the engine leaves after the step before it (its requests' entries rewritten to their
    batch positions mod tp: CL-OWNER-TABLE), in each form the contract allows (:data:`CARRIED_IN_TURN`: some
    of them only, or none), so later steps' owners differ from what the first step's table gives their
    slots."""
    entries = owner_tables.engine_entries(case.tp_size, case.max_num_reqs, rng)
    return owner_tables.carried(case, entries, CARRIED_IN_TURN)


def _usable(case: Case) -> bool:
    """A valid first step whose later steps can be derived (no rejection, no edits of the inputs), on a
    sharder whose requests may change their rows (the decode loop's drafts)."""
    return case.expect_error is None and not case.edits and len(case.slots) > 0 and case.max_num_logits_per_req > 1


def with_steps(base: Case, rng: np.random.Generator, adaptive: bool = False) -> Case:
    """``base`` and its later steps, each with a draw of its profile's inputs on a sharder whose adaptive
    verification is ``adaptive`` (where the profile has it)."""
    rules = base.rules
    first = replace(
        base,
        local_outputs="toy",
        nan_tokens=[],
        description="multi-step: first step",
        layouts=_sent_layouts(base, rules),
    )
    first = with_profile_inputs(without_profile_inputs(first), rules, rng, adaptive=adaptive and rules.adaptive)
    steps, previous = [], first
    for k, kind in enumerate(STEP_KINDS, start=1):
        slots = _slots(kind, first, previous, rng)
        step = _step(first, slots, rng, seed=base.seed + k, description=f"multi-step: {kind}")
        if kind == "grow":  # the decode loop's requests: one with drafts at least, whose admitted counts it changes
            step = _with_a_draft(step, rng)
        step = replace(step, **_options(kind, first, previous, slots))
        step = with_profile_inputs(step, rules, rng, adaptive=first.adaptive_verification)
        if kind == "repeat" and rules.batch_dtypes:  # every batch field in the other dtype than on the first
            step = replace(step, batch_dtypes=flipped_dtypes(first, rules))
        steps.append(step)
        if kind == "grow":  # the most requests of any step (at least two): the decode loop's
            steps += decode_loop(steps[-1], rng, seed=base.seed + 100)
        previous = steps[-1]
    first.then = steps
    return first


# A decode loop: the step before's requests again, in the same slots, each step with one thing changed
# (or none), as an engine's consecutive steps have them. A sharder that keys something it kept on the
# requests (a plan, a width, the local batch) and reuses it where one field moved fails there.
LOOP_KINDS = (
    "seq-lens",
    "admitted",
    "drafts",
    "grammar-joins",
    "logprobs",
    "nan-counts",
    "extensions",
    "order",
    "bound",
    "same",
)


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
    most, no adaptive verification, a single request to reorder). The profile's inputs follow the
    change: admitted and acceptable drafts stay within the rows, the grammar's counts with its requests."""
    n = len(step.slots)
    if kind == "seq-lens":  # the bound follows seq_lens (spec/builders.py)
        return {"seq_lens_growth": step.seq_lens_growth + 1}
    if kind == "drafts":
        if step.max_num_logits_per_req == 1:
            return None
        counts = list(step.num_logits_per_req)
        i = int(rng.integers(n))
        counts[i] = counts[i] % step.max_num_logits_per_req + 1  # another count in [1, max]
        return {"num_logits_per_req": counts, "spec_decode": None, **_within_rows(step, counts)}
    if kind == "admitted":
        return _admitted_change(step, rng)
    if kind == "grammar-joins":
        listed = list(step.grammar_positions or [])
        left = [p for p in range(n) if p not in listed]
        if not left:
            return {"grammar_positions": None, "num_acceptable_drafts": None, "grammar_block_rows": None}
        acceptable = step.num_acceptable_drafts
        joined = None if acceptable is None else [*acceptable, step.num_logits_per_req[left[0]]]
        return {"grammar_positions": [*listed, left[0]], "num_acceptable_drafts": joined}
    if kind == "logprobs":
        return {"logprobs_dims": None if step.logprobs_dims is not None else (1, 2)}
    if kind == "nan-counts":
        return {"gather_num_nans": not step.gather_num_nans}
    if kind == "extensions":  # only where the profile's callers declare extension fields
        if not step.rules.has_extension_fields:
            return None
        return {"extensions": {} if step.extensions else dict(EXTENSION)}
    if kind == "order":
        return None if n < 2 else _reordered(step)
    if kind == "bound":
        return _bound_change(step)
    return {}  # same: nothing changed


def _bound_change(step: Case) -> dict | None:
    """The bound of seq_lens left out where it was passed, or passed again, where the profile's engine may leave
    it out (seq_lens_upper_bound: optional); None elsewhere."""
    rules = step.rules
    if not rules.has_upper_bound or rules.upper_bound_required:
        return None
    if UPPER_BOUND_ABSENT in step.edits:
        return {"edits": [e for e in step.edits if e != UPPER_BOUND_ABSENT]}
    kept = {k: v for k, v in step.batch_dtypes.items() if k != "seq_lens_cpu_upper_bound"}
    return {"edits": [*step.edits, UPPER_BOUND_ABSENT], "batch_dtypes": kept}


def _reordered(step: Case) -> dict:
    """The same requests one batch position later each (the last first); the grammar follows its requests."""
    last = len(step.slots) - 1
    order = [last, *range(last)]
    where = {old: new for new, old in enumerate(order)}
    grammar = None if step.grammar_positions is None else [where[p] for p in step.grammar_positions]
    admitted = None if step.admitted_drafts is None else [step.admitted_drafts[i] for i in order]
    return {
        "slots": [step.slots[i] for i in order],
        "num_logits_per_req": [step.num_logits_per_req[i] for i in order],
        "grammar_positions": grammar,
        "admitted_drafts": admitted,
    }


def _within_rows(step: Case, counts: list[int]) -> dict:
    """The step's admitted and acceptable draft counts cut to the rows ``counts`` schedules."""
    changes = {}
    if step.admitted_drafts is not None:
        changes["admitted_drafts"] = [min(a, c - 1) for a, c in zip(step.admitted_drafts, counts, strict=True)]
    if step.num_acceptable_drafts is not None:
        listed = zip(step.num_acceptable_drafts, step.grammar_positions, strict=True)
        changes["num_acceptable_drafts"] = [min(a, counts[p]) for a, p in listed]
    return changes


def _admitted_change(step: Case, rng: np.random.Generator) -> dict | None:
    """The budget binds otherwise with the same scheduled rows: admitted counts where there were none, else
    one request's count moved (None without adaptive verification or drafts)."""
    drafted = [i for i, c in enumerate(step.num_logits_per_req) if c > 1]
    if not step.adaptive_verification or not drafted:
        return None
    i = drafted[int(rng.integers(len(drafted)))]
    if step.admitted_drafts is None:  # the budget binds: request i admits fewer than it scheduled
        admitted = [int(rng.integers(0, c)) for c in step.num_logits_per_req]
        admitted[i] = int(rng.integers(0, step.num_logits_per_req[i] - 1))
        return {"admitted_drafts": admitted}
    admitted = list(step.admitted_drafts)
    admitted[i] = (admitted[i] + 1) % step.num_logits_per_req[i]  # another count in [0, n_i - 1]
    return {"admitted_drafts": admitted}


def _sent_layouts(case: Case, rules) -> dict[str, str]:
    """``case``'s views that the callers of ``rules`` build (layouts: contiguous keeps none but storage offsets)."""
    if not rules.contiguous_only:
        return dict(case.layouts)
    return {name: layout for name, layout in case.layouts.items() if layout in CONTIGUOUS_LAYOUTS}


def _with_a_draft(step: Case, rng: np.random.Generator) -> Case:
    """``step`` with a draft for one request where none has one (the sharder takes more than one row each)."""
    if step.max_num_logits_per_req == 1 or any(c > 1 for c in step.num_logits_per_req):
        return step
    counts = list(step.num_logits_per_req)
    counts[int(rng.integers(len(counts)))] = int(rng.integers(2, step.max_num_logits_per_req + 1))
    return replace(step, num_logits_per_req=counts)


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
    step (none where the step before had them, else (1, 2)), an extension field on the repeat step (where the
    profile's callers declare them)."""
    if kind == "other-slots":
        return {"grammar_positions": None if previous.grammar_positions else list(range(0, len(slots), 2))}
    if kind == "shrink":
        return {"gather_num_nans": not previous.gather_num_nans}
    if kind == "grow":
        return {"logprobs_dims": None if previous.logprobs_dims is not None else (1, 2)}
    return {"extensions": {**first.extensions, **EXTENSION}} if first.rules.has_extension_fields else {}


def _step(first: Case, slots: list[int], rng: np.random.Generator, seed: int, description: str) -> Case:
    """A step of other requests (``slots``) with the first step's options and none of its profile inputs."""
    counts = [int(c) for c in rng.integers(1, first.max_num_logits_per_req + 1, size=len(slots))]
    grammar = None if first.grammar_positions is None else list(range(0, len(slots), 2))
    return replace(
        without_profile_inputs(first),
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
