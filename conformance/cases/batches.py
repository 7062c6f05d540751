"""Batches the case generators make, and what they read off one: the requests a rank owns, the tokens a
batch schedules, a large batch and the smallest sharder. Both the random draw (cases/strategies.py) and the
realizers (cases/realizers.py) use them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from shardspec.conformance.cases import owner_tables
from shardspec.conformance.cases.input_space import LARGE_BATCH
from shardspec.spec.case import Case, case_owners, least_capacity

# Capacities of a large batch: hundreds of requests, over a few 64-entry blocks.
LARGE_CAPACITIES = (128, 256, 512)


def local_requests(case: Case, rank: int) -> list[int]:
    """The batch positions of the requests ``rank`` owns."""
    owners = case_owners(case)
    return [i for i, owner in enumerate(owners) if owner == rank]


def num_tokens(slots: list[int], counts: list[int]) -> int:
    """The batch's scheduled tokens: build_input_batch's query lengths."""
    return sum(c + s % 3 for c, s in zip(counts, slots, strict=True))


def as_large_batch(case, rng: np.random.Generator):
    """Hundreds of requests (half of the time exactly the capacity) over a small vocabulary, toy-sampled."""
    max_num_reqs = int(rng.choice(LARGE_CAPACITIES))
    num_reqs = int(rng.choice([LARGE_BATCH, max_num_reqs // 2 + 1, max_num_reqs, max_num_reqs]))
    max_logits = int(rng.integers(1, 5))
    slots = [int(s) for s in rng.choice(max_num_reqs, size=num_reqs, replace=False)]
    counts = [int(c) for c in rng.integers(1, max_logits + 1, size=num_reqs)]
    vocab_size = int(rng.choice([8, 33]))
    grammar = None
    if rng.random() < 0.5:
        grammar = [int(p) for p in rng.permutation(num_reqs)[: int(rng.integers(1, num_reqs + 1))]]
    return replace(
        case,
        slots=slots,
        num_logits_per_req=counts,
        max_num_reqs=max_num_reqs,
        max_num_logits_per_req=max_logits,
        spec_decode=None if max(counts) > 1 else case.spec_decode,
        grammar_positions=grammar,
        vocab_size=vocab_size,
        nan_tokens=sorted(int(t) for t in rng.choice(num_tokens(slots, counts), size=3, replace=False)),
        local_outputs="toy",
        # A drawn owner table is drawn again for the new slots (a table of the same kind would be kept
        # for slots the batch no longer has).
        owner_table=None
        if case.owner_table is None
        else owner_tables.draw_entries("mixed", slots, case.tp_size, max_num_reqs, rng),
    )


def capacity_one(case, rng):
    """A sharder of the smallest capacity (1, or tp where the profile needs a slot per rank,
    PRE-CAPACITY-TP): the batch is slot 0 or empty."""
    slots = [0] if case.slots else []
    return replace(
        case,
        max_num_reqs=least_capacity(case),
        slots=slots,
        num_logits_per_req=case.num_logits_per_req[:1],
        grammar_positions=[0] if case.grammar_positions and slots else None,
        num_acceptable_drafts=None,
        admitted_drafts=None if case.admitted_drafts is None else case.admitted_drafts[:1],
        nan_tokens=[],
        local_outputs="toy",
    )
