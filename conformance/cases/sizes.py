"""Every size of the data model at its empty and at its largest value: the input space's ``size`` axis.

The data model names its sizes as symbols (spec/data_model.yaml ``symbols``: N requests, L logits rows,
n and L_local a rank's requests and rows, G grammar requests, k and t logprob columns ...). A defect
that shows only at a size's end (a buffer one short of the capacity, a division by a count that may
be 0, a width capped below what the engine may ask) needs a case at that end. :data:`SIZES` says, for
every symbol and for the batch's draft count, what its empty and its largest value are, the largest
being what the sharder's construction arguments (max_num_reqs, max_num_logits_per_req) or the
vocabulary allow; or why a side has none (a size that follows others). Where no argument bounds a size
(the extension fields' count, an entry's shape E, a local sampler's widths w and c) its largest is one past
what a fixed buffer or table would plausibly hold: every kind and dtype of extension field at once, an
entry as wide as the vocabulary, WIDE_LOCAL_WIDTH columns. A meta-test fails when a symbol of the data
model is missing here (tests/meta/test_input_space.py). :func:`sizes_drawn` measures which ends a case
draws; :data:`SIZE_REALIZERS` make a case draw them (cases/realizers.py): the largest batch draws the
largest N, L, n, L_local and draft count at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from shardspec.spec.case import case_owners, least_capacity
from shardspec.spec.case_edits import DTYPES, EXTENSIONS_DECLARED_EMPTY
from shardspec.spec.model import EXTENSION_DTYPES, EXTENSION_KINDS

SIZE = "size"
EMPTY, LARGEST = "empty", "largest"


@dataclass(frozen=True)
class Size:
    empty: str | None  # the size's empty value, None where it has none (then ``why`` says why)
    largest: str | None  # its largest value, from the construction arguments or the vocabulary
    why: str = ""


# One extension field of each kind and each dtype the spec supports (PRE-EXTENSION-SUPPORTED): the most
# distinct declarations there are, more than a table of fields sized for the few an engine declares holds.
EVERY_EXTENSION = {
    f"{per}_{name}": {"per": per, "dtype": name, "shape": []}
    for per in EXTENSION_KINDS
    for name, dtype in DTYPES.items()
    if dtype in EXTENSION_DTYPES
}
# A local width (sampled-id or logprob columns) past any fixed staging buffer a sampler's output would
# plausibly be copied through (32 columns), as k and t reach WIDE_VOCABULARY.
WIDE_LOCAL_WIDTH = 33


def vocabulary_wide_entry(vocab_size: int) -> dict:
    """A per-row extension entry of one bool per vocabulary token (a sampling mask): E = [V]."""
    return {"per": "logits_row", "dtype": "bool", "shape": [vocab_size]}


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
    "w": Size("0", f"{WIDE_LOCAL_WIDTH} columns or more: past W and past a fixed 32-column staging buffer"),
    "k": Size("0", "V"),
    "t": Size("0", "V"),
    "C": _follows("1 + max(k, t)"),
    "c": Size("0", f"{WIDE_LOCAL_WIDTH} columns or more: past C and past a fixed 32-column staging buffer"),
    "g": _follows("0 or 1: gather_num_nans false and true"),
    "V": _follows(
        "the engine's vocabulary, at least 1; no construction argument bounds it, and what a buffer sized by it would "
        "cut is drawn past any vocabulary: token ids at int64's limits (explicit outputs), k and t up to V"
    ),
    "Vs": _follows("V padded and split over tp"),
    "G": Size("0", "max_num_reqs"),
    "R": _follows("the listed requests' rows (vllm-seed): G's and L's ends"),
    "S": _follows("at least every listed n_i; wider blocks are drawn (profile_inputs), no argument bounds S"),
    "B": _follows("ceil(V / 32)"),
    "E": Size("() (a scalar per entry)", "[V], V >= WIDE_VOCABULARY: one bool per vocabulary token (a sampling mask)"),
    "Re": _follows("M or M * W wire rows: n's and W's ends"),
    "Q": _follows("the owner table's length: max_num_reqs, a construction argument, never changes"),
    # A count that is a field of the batch rather than a symbol.
    "batch.num_draft_tokens": Size("0", "max_num_reqs * (max_num_logits_per_req - 1)"),
    # The declared extension fields' count (extension_fields absent is its presence=absent).
    "extension_fields": Size("{} (declared, none)", "one field of each kind and supported dtype (EVERY_EXTENSION)"),
}


def sizes_without_ends(data_model: dict) -> list[str]:
    """The symbols of a raw data model that :data:`SIZES` does not give both ends or a reason for the
    missing ones (a size added to the spec is named here until its ends are)."""
    return [
        s["name"]
        for s in data_model["symbols"]
        if s["name"] not in SIZES
        or ((SIZES[s["name"]].empty is None or SIZES[s["name"]].largest is None) and not SIZES[s["name"]].why)
    ]


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
    owners = case_owners(case)
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
    return got | _declared_sizes(case) | _local_widths(case)


def _declared_sizes(case) -> set[tuple[str, str, str]]:
    """The ends of the extension fields' count and of an entry's shape E the case declares."""
    got = set()
    if not case.extensions and EXTENSIONS_DECLARED_EMPTY in case.edits:
        got.add(("extension_fields", SIZE, EMPTY))
    if len(case.extensions) >= len(EVERY_EXTENSION):
        got.add(("extension_fields", SIZE, LARGEST))
    for declared in case.extensions.values():
        shape = declared.get("shape") or ()
        if not shape:
            got.add(("E", SIZE, EMPTY))
        elif math.prod(shape) >= case.vocab_size >= WIDE_VOCABULARY:
            got.add(("E", SIZE, LARGEST))
    return got


def _local_widths(case) -> set[tuple[str, str, str]]:
    """The ends of the local sampled-id width w and logprob width c (ranks that own rows): the explicit
    outputs', and the toy sampler's c of 1 + k (its w is a request's rows, 1 to max_num_logits_per_req)."""
    got = set()
    if case.local_outputs == "toy" and case.logprobs_dims is not None and case.slots:
        if 1 + case.logprobs_dims[0] >= WIDE_LOCAL_WIDTH:
            got.add(("c", SIZE, LARGEST))
    if not isinstance(case.local_outputs, dict):
        return got
    for out in case.local_outputs.values():
        widths = {"w": out.sampled_token_ids}
        if case.logprobs_dims is not None and out.logprob_token_ids is not None:
            widths["c"] = out.logprob_token_ids
        for name, rows in widths.items():
            if rows and not rows[0]:
                got.add((name, SIZE, EMPTY))
            if rows and len(rows[0]) >= WIDE_LOCAL_WIDTH:
                got.add((name, SIZE, LARGEST))
    return got


# -------------------------------------------------------------------- making a case draw them


def largest_batch(case, rng):
    """Every slot of a sharder just big enough for the batch, each request at the most rows, every draft
    admitted: N, L, a rank's n and L_local and the draft count reach their largest, and so does the batch's
    cu_num_logits_np, num_reqs * max_num_logits_per_req (slots keep their order)."""
    if not case.slots or case.local_outputs != "toy":
        return None
    order = sorted(range(len(case.slots)), key=lambda i: case.slots[i])
    slots = [0] * len(case.slots)
    for rank, i in enumerate(order):
        slots[i] = rank
    rows = case.max_num_logits_per_req
    blocks = case.grammar_block_rows
    acceptable = case.num_acceptable_drafts
    return replace(
        case,
        slots=slots,
        max_num_reqs=max(len(slots), least_capacity(case)),  # a slot per rank where the profile needs one
        num_logits_per_req=[rows] * len(slots),
        spec_decode=None if rows > 1 else case.spec_decode,
        admitted_drafts=None if case.admitted_drafts is None else [rows - 1] * len(slots),
        grammar_block_rows=None if blocks is None else max(blocks, rows),
        num_acceptable_drafts=None if acceptable is None else [min(a, rows) for a in acceptable],
    )


def _grammar_listing_nothing(case, rng):
    acceptable = None if case.num_acceptable_drafts is None else []
    return replace(case, grammar_positions=[], num_acceptable_drafts=acceptable)


def _grammar_listing_every_slot(case, rng):
    """The largest batch with every request listed by the grammar output, in a random order."""
    case = largest_batch(case, rng)
    if case is None:
        return None
    listed = [int(p) for p in rng.permutation(len(case.slots))]
    acceptable = None
    if case.num_acceptable_drafts is not None:
        acceptable = [int(rng.integers(0, case.num_logits_per_req[p] + 1)) for p in listed]
    return replace(case, grammar_positions=listed, num_acceptable_drafts=acceptable)


# The vocabulary a case needs for its largest k and t: above the 32 columns a fixed buffer would plausibly
# hold, so that the largest width is also wider than such a buffer.
WIDE_VOCABULARY = 33


def _whole_vocabulary_logprobs(case, rng):
    """As many top logprobs and token ids as a vocabulary of at least WIDE_VOCABULARY tokens has
    (toy-sampled: explicit outputs have widths of their own)."""
    if case.local_outputs != "toy" or case.vocab_size < WIDE_VOCABULARY:
        return None
    return replace(case, logprobs_dims=(case.vocab_size, case.vocab_size))


def with_logprobs(case, rank: int, out):
    """``out`` with logprobs of the agreed width for its rows where it has none."""
    if out.logprob_token_ids is not None:
        return out
    owners = case_owners(case)
    rows = sum(n for n, owner in zip(case.num_logits_per_req, owners, strict=True) if owner == rank)
    cols = 1 + max(case.logprobs_dims)
    return replace(
        out,
        logprob_token_ids=[[0] * cols for _ in range(rows)],
        logprobs=[[-1.0] * cols for _ in range(rows)],
        selected_token_ranks=[0] * rows,
    )


def _local_width(name: str, width: int):
    """One rank's explicit sampled ids (``name`` "w") or logprobs ("c") cut or widened to ``width`` columns:
    the values kept stay, the columns added are token 0 and logprob -1."""

    def realize(case, rng):
        if not isinstance(case.local_outputs, dict) or not case.local_outputs:
            return None
        if name == "c" and case.logprobs_dims is None:
            case = replace(case, logprobs_dims=(1, 0))
        ranks = sorted(case.local_outputs)
        rank = ranks[int(rng.integers(len(ranks)))]
        out = case.local_outputs[rank]
        if name == "w":
            out = replace(out, sampled_token_ids=[_resized(row, width, 0) for row in out.sampled_token_ids])
        else:
            out = with_logprobs(case, rank, out)
            out = replace(
                out,
                logprob_token_ids=[_resized(row, width, 0) for row in out.logprob_token_ids],
                logprobs=[_resized(row, width, -1.0) for row in out.logprobs],
            )
            if width == 0:  # the rows' selected ranks, all that is left, differ from a padding row's 0
                out = replace(out, selected_token_ranks=[1 + r % 7 for r in range(len(out.logprob_token_ids))])
        return replace(case, local_outputs={**case.local_outputs, rank: out})

    return realize


def _resized(row: list, width: int, fill) -> list:
    return row[:width] + [fill] * (width - len(row))


def _declared_empty(case, rng):
    if case.extensions:
        return None
    return (
        case
        if EXTENSIONS_DECLARED_EMPTY in case.edits
        else replace(case, edits=[*case.edits, EXTENSIONS_DECLARED_EMPTY])
    )


def _scalar_entry(case, rng):
    return replace(
        case, extensions={**case.extensions, "scalar_entry": {"per": "request", "dtype": "int32", "shape": []}}
    )


def _vocabulary_wide_entry(case, rng):
    """A per-row field of one bool per token, in a vocabulary of at least WIDE_VOCABULARY tokens."""
    if case.vocab_size < WIDE_VOCABULARY:
        return None
    return replace(case, extensions={**case.extensions, "vocabulary_mask": vocabulary_wide_entry(case.vocab_size)})


SIZE_REALIZERS = {
    **{f"{name}:{SIZE}={LARGEST}": largest_batch for name in ("N", "L", "n", "L_local", "batch.num_draft_tokens")},
    f"G:{SIZE}={EMPTY}": _grammar_listing_nothing,
    f"G:{SIZE}={LARGEST}": _grammar_listing_every_slot,
    f"k:{SIZE}={LARGEST}": _whole_vocabulary_logprobs,
    f"t:{SIZE}={LARGEST}": _whole_vocabulary_logprobs,
    f"extension_fields:{SIZE}={EMPTY}": _declared_empty,
    f"extension_fields:{SIZE}={LARGEST}": lambda c, r: replace(c, extensions={**c.extensions, **EVERY_EXTENSION}),
    f"E:{SIZE}={EMPTY}": _scalar_entry,
    f"E:{SIZE}={LARGEST}": _vocabulary_wide_entry,
    **{f"{name}:{SIZE}={EMPTY}": _local_width(name, 0) for name in ("w", "c")},
    **{f"{name}:{SIZE}={LARGEST}": _local_width(name, WIDE_LOCAL_WIDTH) for name in ("w", "c")},
}
