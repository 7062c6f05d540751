"""Multi-step cases: one sharder instance called for several consecutive steps, as an engine calls it.

State and workspace reuse are where an implementation can go wrong only on a
later step: a plan cached by batch size, a buffer sized by the first batch, a
view into last step's output. Each multi-step case starts from a generated
case and then changes the batch the way engines do: the same number of
requests in other slots, fewer requests, more requests (up to the capacity),
and the first shape again. The step's options change too, as the input space
says an engine may change them between steps (conformance/cases/input_space.py,
axis ``step``): the grammar output comes and goes, NaN counts and logprobs are
asked for on some steps only, and the last step declares an extension field. A
sharder that keeps a width, a flag or a buffer from an earlier step fails
there. Every step is judged on its own (``<case id>.step<k>``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from shardspec.conformance.cases.realizers import EXTENSION
from shardspec.spec.case import Case
from shardspec.spec.model import DEFAULT_PROFILE
from shardspec.spec.profiles import root_profile

STEP_KINDS = ("other-slots", "shrink", "grow", "repeat")


def multi_step_cases(tp_size: int, count: int, seed: int) -> list[Case]:
    """``count`` multi-step cases for ``tp_size``; the same for the same seed."""
    from shardspec.conformance.cases.strategies import generate_cases

    # Bases under the root profile, without a later release's per-request inputs: the later steps are
    # derived from the first's fields.
    base = root_profile(DEFAULT_PROFILE)
    bases = [c for c in generate_cases(tp_size, count * 2, seed + 7919, base, fill_gaps=False) if _usable(c)][:count]
    cases = []
    for number, base in enumerate(bases):
        rng = np.random.default_rng([seed, tp_size, number, 17])
        case = with_steps(base, rng)
        case.case_id = f"multi-tp{tp_size}-s{seed}-{number:03d}"
        cases.append(case)
    return cases


def _usable(case: Case) -> bool:
    """A valid first step whose later steps can be derived (no rejection, no edits of the inputs)."""
    return case.expect_error is None and not case.edits and len(case.slots) > 0


def with_steps(base: Case, rng: np.random.Generator) -> Case:
    first = replace(base, local_outputs="toy", nan_tokens=[], description="multi-step: first step")
    steps, previous = [], first
    for k, kind in enumerate(STEP_KINDS, start=1):
        slots = _slots(kind, first, previous, rng)
        step = _step(first, slots, rng, seed=base.seed + k, description=f"multi-step: {kind}")
        steps.append(replace(step, **_options(kind, first, previous, slots)))
        previous = steps[-1]
    first.then = steps
    return first


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
