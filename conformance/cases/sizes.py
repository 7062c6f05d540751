"""Every size of the data model at its empty and at its largest value: the input space's ``size`` axis.

The data model names its sizes as symbols (spec/data_model.yaml ``symbols``: N requests, L logits rows,
n and L_local a rank's requests and rows, G grammar requests, k and t logprob columns ...). A defect
that shows only at a size's end (a buffer one short of the capacity, a division by a count that may
be 0, a width capped below what the engine may ask) needs a case at that end. :data:`SIZES` says, for
every symbol and for the batch's draft count, what its empty and its largest value are, the largest
being what the sharder's construction arguments (max_num_reqs, max_num_logits_per_req) or the
vocabulary allow; or why a side has none (a size that follows others, one no argument bounds). A
meta-test fails when a symbol of the data model is missing here (tests/meta/test_input_space.py).
:func:`sizes_drawn` measures which ends a case draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardspec.spec.profiles import rules_of

SIZE = "size"
EMPTY, LARGEST = "empty", "largest"


@dataclass(frozen=True)
class Size:
    empty: str | None  # the size's empty value, None where it has none (then ``why`` says why)
    largest: str | None  # its largest value, from the construction arguments or the vocabulary
    why: str = ""


def _follows(why: str) -> Size:
    return Size(None, None, why)


SIZES: dict[str, Size] = {
    "tp": _follows("the group size: the run's --tp, not an input of a step"),
    "N": Size("0", "max_num_reqs"),
    "L": Size("0", "max_num_reqs * max_num_logits_per_req"),
    "Ls": _follows("L's scheduled rows: L itself but where admitted counts are given"),
    "T": _follows("the engine's query lengths, at least L; no construction argument bounds them"),
    "n": Size("0", "ceil(max_num_reqs / tp)"),
    "L_local": Size("0", "ceil(max_num_reqs / tp) * max_num_logits_per_req"),
    "M": _follows("the largest n over the ranks: n's ends"),
    "W": _follows("the largest n_i, 1 to max_num_logits_per_req: batch.num_draft_tokens_per_req's min and max"),
    "w": _follows("the local sampler's choice, any width; narrower and wider than W are explicit outputs"),
    "k": Size("0", "V"),
    "t": Size("0", "V"),
    "C": _follows("1 + max(k, t)"),
    "c": _follows("the local sampler's choice, any width, like w"),
    "g": _follows("0 or 1: gather_num_nans false and true"),
    "V": _follows("the engine's vocabulary; no construction argument bounds it"),
    "Vs": _follows("V padded and split over tp"),
    "G": Size("0", "max_num_reqs"),
    "R": _follows("the listed requests' rows (vllm-seed): G's and L's ends"),
    "S": _follows("at least every listed n_i; wider blocks are drawn (profile_inputs), no argument bounds S"),
    "B": _follows("ceil(V / 32)"),
    "E": _follows("the engine's declared entry shape, scalar or not; no argument bounds it"),
    "Re": _follows("M or M * W wire rows: n's and W's ends"),
    # A count that is a field of the batch rather than a symbol.
    "batch.num_draft_tokens": Size("0", "max_num_reqs * (max_num_logits_per_req - 1)"),
}


def size_variations() -> list[tuple[str, str, str]]:
    """(size, SIZE, end) for every end a size of :data:`SIZES` has."""
    return [
        (name, SIZE, end)
        for name, size in SIZES.items()
        for end, value in ((EMPTY, size.empty), (LARGEST, size.largest))
        if value is not None
    ]


def sizes_drawn(case) -> set[tuple[str, str, str]]:
    """The ends of sizes one step of ``case`` draws (the batch's device rows: admitted ones where given)."""
    got: set[tuple[str, str, str]] = set()
    cap, cap_rows, tp = case.max_num_reqs, case.max_num_logits_per_req, case.tp_size
    rows = [len(r) for r in case.sampled_tokens()]
    owners = rules_of(case.profile).owners(case.slots, tp)
    per_rank = [[i for i, o in enumerate(owners) if o == r] for r in range(tp)]
    most = math.ceil(cap / tp)

    def ends(name: str, value: int, largest: int) -> None:
        if value == 0:
            got.add((name, SIZE, EMPTY))
        if value == largest > 0:
            got.add((name, SIZE, LARGEST))

    ends("N", len(case.slots), cap)
    ends("L", sum(rows), cap * cap_rows)
    for owned in per_rank:
        ends("n", len(owned), most)
        ends("L_local", sum(rows[i] for i in owned), most * cap_rows)
    if case.grammar_positions is not None:
        ends("G", len(case.grammar_positions), cap)
    if case.logprobs_dims is not None:
        ends("k", case.logprobs_dims[0], case.vocab_size)
        ends("t", case.logprobs_dims[1], case.vocab_size)
    ends("batch.num_draft_tokens", sum(r - 1 for r in rows), cap * (cap_rows - 1))
    return got
