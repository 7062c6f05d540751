"""Shrink a failing case to a small one that fails the same way: exactly the same invariant IDs.

Shrinking runs the implementation, so the suite does it in a child process
(:func:`shardspec.conformance.replay.shrink_in_child`): a crash there loses the minimal case, not the run.

Greedy: try simpler variants of the case (fewer requests, fewer rows, no
grammar, no NaNs, no logprobs, toy outputs, float32 logits, contiguous inputs,
smaller slots and vocab) in the
in-process mode and keep any that fails exactly the original failure's
invariant IDs (and raises in the same steps), until no variant does or the
budget is spent. A variant that fails fewer, other or more invariants is a
different failure: the minimal case's reproduce command must show the one
reported. When no variant keeps it, the outcome says so and why.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from shardspec.conformance.record import ERROR, CaseResult
from shardspec.spec.case import Case, least_capacity

RunCase = Callable[[Case], CaseResult]


def signature(result: CaseResult) -> set[str]:
    """What failed: invariant IDs, plus "error:<step>" for raised errors."""
    failed = {v["invariant_id"] for v in result.violations}
    failed |= {f"error:{e.get('step')}" for e in result.errors if e["kind"] == "raised"}
    return failed


def shrinkable(result: CaseResult) -> bool:
    """Hangs and harness failures cannot be replayed safely in one process."""
    return result.status != ERROR or all(e["kind"] in ("raised", "peer", "stopped") for e in result.errors)


def shrink(case: Case, failure: CaseResult, run: RunCase, budget_s: float = 30.0, max_runs: int = 300) -> Case:
    return shrink_to(case, signature(failure), run, budget_s, max_runs)


def shrink_to(case: Case, target: set[str], run: RunCase, budget_s: float = 30.0, max_runs: int = 300) -> Case:
    """The smallest variant found that fails exactly ``target``'s IDs (``case`` itself when none does)."""
    return shrink_keeping(case, target, run, budget_s, max_runs).case


@dataclass
class Shrunk:
    """What a shrink found: the smallest case, how many simplifications it kept, what the others failed."""

    case: Case
    simplifications: int = 0
    tried: int = 0  # variants run
    replayed: frozenset[str] | None = None  # what the case itself fails in one process, where not the target
    others: dict[frozenset[str], int] = field(default_factory=dict)  # what rejected variants failed, how often

    def describe(self, target: set[str]) -> str:
        kept = ", ".join(sorted(target)) or "nothing"
        if self.replayed is not None:
            return f"not shrunk: replayed in one process it fails {_ids(self.replayed)}, not exactly {kept}"
        if self.simplifications:
            return f"shrunk in {self.simplifications} step(s); it fails exactly {kept}, as the case does"
        seen = "; ".join(f"{n} failed {_ids(ids)}" for ids, n in sorted(self.others.items(), key=lambda i: -i[1])[:3])
        return f"not shrunk: none of the {self.tried} smaller variant(s) tried fails exactly {kept}" + (
            f" ({seen})" if seen else ""
        )


def _ids(ids: frozenset[str]) -> str:
    return ", ".join(sorted(ids)) or "nothing (it passes)"


def shrink_keeping(case: Case, target: set[str], run: RunCase, budget_s: float = 30.0, max_runs: int = 300) -> Shrunk:
    """Greedy: keep any simpler variant whose signature is ``target``, until none is or the budget is spent."""
    deadline = time.monotonic() + budget_s
    outcome = Shrunk(case)
    replayed = frozenset(signature(run(case)))
    if replayed != frozenset(target):
        outcome.replayed = replayed
        return _renamed(outcome, case)
    current, improved = case, True
    while improved and outcome.tried < max_runs and time.monotonic() < deadline:
        improved = False
        for candidate in candidates(current):
            outcome.tried += 1
            failed = frozenset(signature(run(candidate)))
            if failed == frozenset(target):
                current, improved = candidate, True
                outcome.simplifications += 1
                break
            outcome.others[failed] = outcome.others.get(failed, 0) + 1
            if outcome.tried >= max_runs or time.monotonic() > deadline:
                break
    outcome.case = current
    return _renamed(outcome, case)


def _renamed(outcome: Shrunk, original: Case) -> Shrunk:
    description = f"shrunk from {original.case_id}" if outcome.simplifications else f"not shrunk: {original.case_id}"
    outcome.case = replace(outcome.case, case_id=f"{original.case_id}-min", description=description)
    return outcome


def candidates(case: Case) -> Iterator[Case]:
    """Simpler variants of ``case``, roughly the biggest simplifications first."""
    if case.local_outputs != "toy":
        yield replace(case, local_outputs="toy")
    n = len(case.slots)
    if case.local_outputs == "toy":
        if n > 1:
            yield from (_without_requests(case, keep) for keep in (range(n // 2), range(n // 2, n)))
        yield from (_without_requests(case, [j for j in range(n) if j != i]) for i in range(n))
        for i, count in enumerate(case.num_logits_per_req):
            if count > 1:
                counts = list(case.num_logits_per_req)
                counts[i] = count - 1
                yield _clean(replace(case, num_logits_per_req=counts))
    yield from _simpler_options(case)
    yield from _smaller_slots(case)


def _simpler_options(case: Case) -> Iterator[Case]:
    if case.grammar_positions is not None:
        yield _with_grammar(case, None)
        if len(case.grammar_positions) > 1:
            yield _with_grammar(case, sorted(case.grammar_positions)[:1])
    if case.nan_tokens:
        yield replace(case, nan_tokens=[])
    if case.logprobs_dims is not None and case.local_outputs == "toy":
        yield replace(case, logprobs_dims=None)
    if case.logprobs_dims is not None and case.logprobs_dims != (0, 0):
        k, max_token_ids = case.logprobs_dims
        yield replace(case, logprobs_dims=(min(k, 1), 0 if max_token_ids <= k else min(max_token_ids, 2)))
    if case.gather_num_nans:
        yield replace(case, gather_num_nans=False)
    if case.vocab_size > 8 and case.local_outputs == "toy":
        yield replace(case, vocab_size=8, logprobs_dims=_clip_dims(case.logprobs_dims, 8))
    if case.seed != 0:
        yield replace(case, seed=0)
    if case.logits_dtype != "float32":
        yield replace(case, logits_dtype="float32")
    if case.layouts:  # every input contiguous, then one view at a time
        yield replace(case, layouts={})
        for name in case.layouts:
            yield replace(case, layouts={k: v for k, v in case.layouts.items() if k != name})
    if case.spec_decode is not None and all(c == 1 for c in case.num_logits_per_req):
        yield replace(case, spec_decode=None)
    smallest_capacity = (
        max(max(case.slots, default=0) + 1, least_capacity(case)),
        max(case.num_logits_per_req, default=1),
    )
    if case.expect_error is None and (case.max_num_reqs, case.max_num_logits_per_req) != smallest_capacity:
        yield replace(case, max_num_reqs=smallest_capacity[0], max_num_logits_per_req=smallest_capacity[1])


def _smaller_slots(case: Case) -> Iterator[Case]:
    """Lower each slot by multiples of tp: the owner stays, numbers get small."""
    for i, slot in enumerate(case.slots):
        lowest = slot % case.tp_size
        taken = set(case.slots)
        for lower in range(lowest, slot, case.tp_size):
            if lower not in taken:
                slots = list(case.slots)
                slots[i] = lower
                yield replace(case, slots=slots)
                break


def _clip_dims(dims: tuple[int, int] | None, vocab: int):
    return None if dims is None else (min(dims[0], vocab), dims[1])


def _without_requests(case: Case, keep) -> Case:
    keep = list(keep)
    new_position = {old: new for new, old in enumerate(keep)}
    grammar = acceptable = None
    if case.grammar_positions is not None:
        listed = [k for k, p in enumerate(case.grammar_positions) if p in new_position]
        grammar = [new_position[case.grammar_positions[k]] for k in listed] or None
        if grammar and case.num_acceptable_drafts is not None:
            acceptable = [case.num_acceptable_drafts[k] for k in listed]
    admitted = None if case.admitted_drafts is None else [case.admitted_drafts[i] for i in keep]
    return _clean(
        replace(
            case,
            slots=[case.slots[i] for i in keep],
            num_logits_per_req=[case.num_logits_per_req[i] for i in keep],
            grammar_positions=grammar,
            num_acceptable_drafts=acceptable,
            admitted_drafts=admitted,
        )
    )


def _with_grammar(case: Case, positions: list[int] | None) -> Case:
    """``case`` listing ``positions`` (a subset of its own), their acceptable-draft counts kept with them."""
    acceptable = None
    if positions and case.num_acceptable_drafts is not None:
        acceptable = [case.num_acceptable_drafts[case.grammar_positions.index(p)] for p in positions]
    return replace(case, grammar_positions=positions, num_acceptable_drafts=acceptable)


def _clean(case: Case) -> Case:
    """Drop NaN tokens beyond the (possibly smaller) token count; admit no more drafts than a request
    still has (vllm-0.33)."""
    num_tokens = sum(c + s % 3 for c, s in zip(case.num_logits_per_req, case.slots, strict=False))
    admitted = case.admitted_drafts
    if admitted is not None:
        admitted = [min(a, c - 1) for a, c in zip(admitted, case.num_logits_per_req, strict=True)]
    return replace(case, nan_tokens=[t for t in case.nan_tokens if t < num_tokens], admitted_drafts=admitted)
