"""Cases that violate each precondition at each boundary it states, at every tp size.

spec/preconditions.yaml gives every precondition ``boundaries``: the fields changed together, the side
of their range (``below``, ``above``, ``other``) and the value. :func:`boundary_cases` turns each
boundary of each precondition whose violation MUST be rejected into one case per tp size, from a
seeded valid batch; where the precondition is raised on every rank (replicated inputs), the batch
leaves ranks that own nothing, which must reject it too. A precondition raised only on the faulty
rank gets a batch in which every rank owns a request, so every rank is faulty and none is left in a
collective.

How a boundary becomes a case is :data:`REALIZERS`, keyed by the boundary's first field, side and
value: the change of a valid batch that puts that field at that value. A boundary without a
realizer (one the case format cannot express yet, such as a host copy one entry short) yields no
case and is listed by :func:`missing`, so tests/meta sees every gap.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from shardspec.conformance.cases.input_space import holds
from shardspec.spec.case import Case, ExplicitLocalOutput, case_owners, construction_refusal, least_capacity
from shardspec.spec.case_edits import UPPER_BOUND_ABSENT
from shardspec.spec.model import DEFAULT_PROFILE
from shardspec.spec.profiles import rules_of

TP_SIZES = (1, 2, 3, 4, 8)


@dataclass(frozen=True)
class Boundary:
    pre: str
    fields: tuple[str, ...]
    side: str
    value: str
    raised_on: str
    # The rule values the precondition's entry requires ((rule, values), spec/rules.py); empty: none.
    requires: tuple

    @property
    def key(self) -> str:
        return f"{self.fields[0]}:{self.side}={self.value}"

    @property
    def slug(self) -> str:
        text = f"{self.fields[0].split('.')[-1]}-{self.side}-{self.value}".lower()
        return re.sub("-+", "-", "".join(c if c.isalnum() else "-" for c in text)).strip("-")


def _requires(entry: dict) -> tuple:
    found = (entry.get("requires") or {}).items()
    return tuple(sorted((rule, tuple(v) if isinstance(v, list) else (v,)) for rule, v in found))


def boundaries(profile: str = DEFAULT_PROFILE) -> list[Boundary]:
    """Every boundary of every must-reject precondition under ``profile``, from the raw YAML."""
    from shardspec.spec.loader import _package_root, document_schema, load_yaml_document

    raw = load_yaml_document(_package_root().joinpath("preconditions.yaml"), document_schema("preconditions"))
    out = []
    for entry in raw["preconditions"]:
        if entry.get("retired") or entry["on_violation"]["outcome"] != "reject":
            continue
        if not holds(entry, profile):
            continue
        for b in entry.get("boundaries", []):
            out.append(
                Boundary(
                    entry["id"],
                    tuple(b["fields"]),
                    b["side"],
                    str(b["value"]),
                    entry["on_violation"]["raised_on"],
                    _requires(entry),
                )
            )
    return out


# ------------------------------------------------------------------ the valid batch


def _base(pre: str, tp: int, rng: np.random.Generator, every_rank_owns: bool, profile: str) -> Case:
    """A small valid batch: every rank owns a request, or (tp > 1) some ranks own none."""
    capacity = 64
    if every_rank_owns or tp == 1:
        slots = [int(r + tp * k) for r, k in zip(range(tp), rng.integers(0, capacity // tp, size=tp), strict=True)]
        slots += [int(s) for s in rng.choice([s for s in range(capacity) if s not in slots], size=1, replace=False)]
    else:
        owners = sorted(int(r) for r in rng.choice(tp, size=max(1, tp // 2), replace=False))
        slots = [o + tp * int(rng.integers(0, capacity // tp)) for o in owners]
        slots = list(dict.fromkeys(slots))
    order = rng.permutation(len(slots))
    slots = [slots[int(i)] for i in order]
    return Case(
        case_id="boundary",
        tp_size=tp,
        slots=slots,
        num_logits_per_req=[1] * len(slots),
        max_num_reqs=capacity,
        max_num_logits_per_req=4,
        logprobs_dims=None,
        seed=int(rng.integers(0, 2**16)),
        rules=rules_of(profile),
        expect_error=pre,
    )


def _counts(case: Case, counts: list[int]) -> Case:
    return replace(case, num_logits_per_req=counts)


def _one_at(case: Case, value: int, rng) -> list[int]:
    counts = list(case.num_logits_per_req)
    counts[int(rng.integers(len(counts)))] = value
    return counts


def _slot_at(value_of: Callable) -> Callable:
    def realize(case, rng):
        slots = list(case.slots)
        slots[int(rng.integers(len(slots)))] = value_of(case)
        return replace(case, slots=slots)

    return realize


def _requests_over_capacity(case) -> int:
    """How many requests a batch needs so that one slot fewer is still a slot per rank where the profile
    needs one (PRE-CAPACITY-TP): the batch, not the capacity, is then at fault."""
    least = least_capacity(case)
    return len(case.slots) if least == 1 else max(len(case.slots), least + 1)


def _capacity_below_batch(case, rng):
    n = _requests_over_capacity(case)
    return replace(case, slots=list(range(n)), num_logits_per_req=[1] * n, max_num_reqs=n - 1)


def _capacity_at_largest_slot(case, rng):
    largest = max(max(case.slots), len(case.slots), least_capacity(case))
    slots = list(case.slots)
    if largest not in slots:
        slots[0] = largest
    return replace(case, slots=slots, max_num_reqs=largest)


def _too_many_requests(case, rng):
    n = _requests_over_capacity(case)
    return replace(case, slots=list(range(n)), num_logits_per_req=[1] * n, max_num_reqs=n - 1)


def _bound_absent(case, rng):
    """No seq_lens_cpu_upper_bound: a violation only where the engine always passes one."""
    return replace(case, edits=[UPPER_BOUND_ABSENT]) if rules_of(case.profile).upper_bound_required else None


def _group_of_one(case, rng):
    """A valid batch in a group of one: only a tp 1 case breaks PRE-TP-SIZE."""
    return case if case.tp_size == 1 else None


def _fewer_slots_than_ranks(case, rng):
    """One request in slot 0 of a sharder with tp - 1 slots (PRE-CAPACITY-TP); no such sharder at tp 1."""
    if case.tp_size < 2:
        return None
    return replace(case, slots=[0], num_logits_per_req=[1], max_num_reqs=case.tp_size - 1)


def _repeat_slot(case, rng):
    return replace(
        case,
        slots=[*case.slots, case.slots[int(rng.integers(len(case.slots)))]],
        num_logits_per_req=[*case.num_logits_per_req, 1],
    )


def _grammar(case: Case, **fields) -> Case:
    return replace(case, grammar_positions=list(range(len(case.slots))), **fields)


def _explicit_outputs(case: Case, shorten: str | None = None, drop_rank: bool = False, by: int = -1) -> Case:
    """Valid explicit outputs for every owning rank, each with ``shorten`` one entry short (``by`` -1) or
    long (``by`` 1) (or, with ``drop_rank``, every owning rank passing None)."""
    outputs = {}
    for rank in range(case.tp_size):
        owners = case_owners(case)
        owned = [i for i, owner in enumerate(owners) if owner == rank]
        if not owned:
            continue
        rows = sum(case.num_logits_per_req[i] for i in owned)
        out = ExplicitLocalOutput(
            sampled_token_ids=[[1] for _ in owned],
            num_sampled=[1] * len(owned),
            num_rejected=[0] * len(owned),
            num_nans=[0] * rows,
            logprob_token_ids=[[1, 2, 3] for _ in range(rows)],
            logprobs=[[-0.5, -1.0, -2.0] for _ in range(rows)],
            selected_token_ranks=[0] * rows,
        )
        names = ("logprob_token_ids", "logprobs", "selected_token_ranks") if shorten == "logprobs_tensors" else ()
        if shorten is not None:
            out = replace(out, **{name: _one_off(getattr(out, name), by) for name in names or (shorten,)})
        outputs[rank] = out
    if drop_rank:
        outputs = {}  # every owning rank passes None
    return replace(case, local_outputs=outputs, logprobs_dims=(2, 0), gather_num_nans=True)


def _one_off(values: list, by: int) -> list:
    """``values`` one entry short (``by`` -1) or long (``by`` 1: its last entry repeated)."""
    return values[:-1] if by < 0 else [*values, values[-1]]


def _edit(name: str) -> Callable:
    return lambda case, rng: replace(case, edits=[name])


REALIZERS: dict[str, Callable] = {
    "sharder.tp_size:below=1": _group_of_one,
    "sharder.max_num_reqs:below=tp - 1": _fewer_slots_than_ranks,
    "sharder.tp_size:above=max_num_reqs + 1": _fewer_slots_than_ranks,  # the same sharder, seen from the group
    "batch.req_ids:below=num_reqs - 1": lambda c, r: replace(c, edits=["req-ids-short"]),
    "batch.num_reqs:above=max_num_reqs + 1": _too_many_requests,
    "sharder.max_num_reqs:below=num_reqs - 1": _capacity_below_batch,
    "batch.idx_mapping:other=float32": lambda c, r: replace(c, batch_dtypes={"idx_mapping": "float32"}),
    "batch.idx_mapping:other=int16": lambda c, r: replace(c, batch_dtypes={"idx_mapping": "int16"}),
    "batch.cu_num_logits:other=float32": lambda c, r: replace(c, batch_dtypes={"cu_num_logits": "float32"}),
    "batch.cu_num_logits:other=int16": lambda c, r: replace(c, batch_dtypes={"cu_num_logits": "int16"}),
    "batch.idx_mapping:below=-1": _slot_at(lambda c: -1),
    "batch.idx_mapping:above=max_num_reqs": _slot_at(lambda c: c.max_num_reqs),
    "sharder.max_num_reqs:below=largest slot": _capacity_at_largest_slot,
    "batch.idx_mapping:other=repeat": _repeat_slot,
    "batch.cu_num_logits_np:above=cu_num_logits_np[0] = 1": lambda c, r: replace(c, edits=["cu-logits-from-one"]),
    "batch.cu_num_logits:below=0": lambda c, r: _counts(c, _one_at(c, 0, r)),
    "batch.cu_num_logits:above=max_num_logits_per_req + 1": lambda c, r: _counts(
        c, _one_at(c, c.max_num_logits_per_req + 1, r)
    ),
    "sharder.max_num_logits_per_req:below=largest n_i - 1": lambda c, r: replace(
        _counts(c, _one_at(c, 3, r)), max_num_logits_per_req=2
    ),
    "batch.seq_lens:below=N - 1": lambda c, r: replace(c, edits=["seq-lens-short"]),
    "batch.seq_lens_cpu_upper_bound:below=N - 1": lambda c, r: replace(c, edits=["seq-lens-upper-bound-short"]),
    "batch.num_draft_tokens:above=sum + 1": lambda c, r: replace(
        _counts(c, _one_at(c, 2, r)), edits=["draft-total-plus-one"]
    ),
    "batch.num_draft_tokens_per_req:other=None": lambda c, r: replace(_counts(c, _one_at(c, 2, r)), spec_decode=False),
    "batch.num_admitted_draft_tokens:above=num_draft_tokens_per_req + 1": lambda c, r: replace(
        _counts(c, [2] * len(c.slots)),
        adaptive_verification=True,
        admitted_drafts=_one_at(_counts(c, [0] * len(c.slots)), 2, r),
    ),
    "batch.num_admitted_draft_tokens:below=-1": lambda c, r: replace(
        _counts(c, [2] * len(c.slots)),
        adaptive_verification=True,
        admitted_drafts=_one_at(_counts(c, [0] * len(c.slots)), -1, r),
    ),
    "grammar.structured_output_request_ids:other=repeat": lambda c, r: replace(
        c, grammar_positions=[*range(len(c.slots)), 0]
    ),
    "grammar.grammar_bitmask:below=G * S - 1": lambda c, r: _grammar(
        c, max_num_logits_per_req=1, edits=["grammar-bitmask-short"]
    ),
    "grammar.grammar_bitmask:below=R - 1": lambda c, r: _grammar(c, edits=["grammar-bitmask-short"]),
    "grammar.grammar_bitmask:below=S = largest listed n_i - 1": lambda c, r: _grammar(
        _counts(c, _one_at(c, 3, r)), grammar_block_rows=2
    ),
    "grammar.num_acceptable_drafts:below=G - 1": lambda c, r: _grammar(
        c, num_acceptable_drafts=[0] * (len(c.slots) - 1)
    ),
    "grammar.num_acceptable_drafts:above=G + 1": lambda c, r: _grammar(
        c, num_acceptable_drafts=[0] * len(c.slots), edits=["acceptable-drafts-extra"]
    ),
    "local_output:other=None": lambda c, r: _explicit_outputs(c, drop_rank=True),
    "local_output.sampled_token_ids:above=n + 1": lambda c, r: replace(c, edits=["local-output-extra-row"]),
    "local_output.num_sampled:below=n - 1": lambda c, r: _explicit_outputs(c, "num_sampled"),
    "local_output.num_rejected:below=n - 1": lambda c, r: _explicit_outputs(c, "num_rejected"),
    "local_output.num_nans:below=L_local - 1": lambda c, r: _explicit_outputs(c, "num_nans"),
    "local_output.logprobs_tensors:below=L_local - 1": lambda c, r: _explicit_outputs(c, "logprobs_tensors"),
    "local_output.sampled_token_ids:below=n - 1": lambda c, r: _explicit_outputs(c, "sampled_token_ids"),
    "local_output.num_sampled:above=n + 1": lambda c, r: _explicit_outputs(c, "num_sampled", by=1),
    "local_output.num_rejected:above=n + 1": lambda c, r: _explicit_outputs(c, "num_rejected", by=1),
    "local_output.num_nans:above=L_local + 1": lambda c, r: _explicit_outputs(c, "num_nans", by=1),
    "local_output.logprobs_tensors:above=L_local + 1": lambda c, r: _explicit_outputs(c, "logprobs_tensors", by=1),
    "batch.req_ids:above=num_reqs + 1": _edit("req-ids-long"),
    "batch.idx_mapping_np:above=num_reqs + 1": _edit("idx-mapping-np-long"),
    "batch.cu_num_logits_np:above=N + 2 entries": _edit("cu-logits-np-long"),
    "batch.seq_lens:above=N + 1": _edit("seq-lens-long"),
    "batch.seq_lens_cpu_upper_bound:above=N + 1": _edit("seq-lens-upper-bound-long"),
    "batch.seq_lens_cpu_upper_bound:other=None": _bound_absent,
    "batch.logits_indices:above=L + 1": _edit("logits-indices-long"),
    "batch.expanded_idx_mapping:above=L + 1": _edit("expanded-idx-mapping-long"),
    "batch.expanded_local_pos:above=L + 1": _edit("expanded-local-pos-long"),
    "grammar.grammar_bitmask:above=G * S + 1": lambda c, r: _grammar(
        c, max_num_logits_per_req=1, edits=["grammar-bitmask-long"]
    ),
    "grammar.grammar_bitmask:above=R + 1": lambda c, r: _grammar(c, edits=["grammar-bitmask-long"]),
    "logprobs_dims:below=k = -1": lambda c, r: replace(c, logprobs_dims=(-1, int(r.integers(0, 3)))),
    "logprobs_dims:below=t = -1": lambda c, r: replace(c, logprobs_dims=(int(r.integers(0, 3)), -1)),
    "logits_shard:above=L + 1": lambda c, r: replace(c, edits=["logits-shard-extra-row"]),
    "local_output.extensions:other=undeclared": lambda c, r: replace(c, edits=["extension-undeclared"]),
    "extension_fields:other=int16": lambda c, r: replace(
        c, extensions={"counts": {"per": "request", "dtype": "int16", "shape": []}}
    ),
    "batch.num_reqs:above=len(req_ids) + 1": lambda c, r: replace(c, edits=["num-reqs-plus-one"]),
    "batch.idx_mapping_np:below=num_reqs - 1": lambda c, r: replace(c, edits=["idx-mapping-np-short"]),
    "batch.idx_mapping_np:other=float64": lambda c, r: replace(c, edits=["idx-mapping-np-float64"]),
    "batch.num_draft_tokens_per_req:other=float32": lambda c, r: replace(
        _counts(c, _one_at(c, 2, r)), edits=["draft-counts-float32"]
    ),
    "batch.cu_num_logits_np:below=N entries": lambda c, r: replace(c, edits=["cu-logits-np-short"]),
    "batch.logits_indices:below=L - 1": lambda c, r: replace(c, edits=["logits-indices-short"]),
    "batch.expanded_idx_mapping:below=L - 1": lambda c, r: replace(c, edits=["expanded-idx-mapping-short"]),
    "batch.expanded_local_pos:below=L - 1": lambda c, r: replace(c, edits=["expanded-local-pos-short"]),
    "grammar.structured_output_request_ids:other=unknown": lambda c, r: _grammar(c, edits=["grammar-id-unknown"]),
    "logits_shard:below=L - 1": lambda c, r: replace(c, edits=["logits-shard-short"]),
    "logits_shard:other=int32": lambda c, r: replace(c, edits=["logits-shard-int32"]),
    "owner_table:below=max_num_reqs - 1": _edit("owner-table-short"),
    "owner_table:above=max_num_reqs + 1": _edit("owner-table-long"),
    "owner_table:other=float64": _edit("owner-table-float64"),
    "owner_table:other=None": _edit("owner-table-absent"),
    "owner_table:below=-1": _edit("owner-table-negative"),
    "owner_table:above=tp": _edit("owner-table-past-tp"),
    "extension_fields:other=missing": lambda c, r: replace(
        c, extensions={"counts": {"per": "request", "dtype": "int32", "shape": []}}, edits=["extension-missing"]
    ),
}


def _case_for(boundary: Boundary, tp: int, profile: str, seed: int) -> Case | None:
    realizer = REALIZERS.get(boundary.key)
    if realizer is None or not applies_at(boundary, tp, profile):
        return None
    rng = np.random.default_rng([seed, tp, sum(map(ord, boundary.pre + boundary.key))])
    every_rank_owns = boundary.raised_on != "every rank"
    base = _base(boundary.pre, tp, rng, every_rank_owns, profile)
    case = realizer(base, rng)
    if case is None:
        return None
    refused = construction_refusal(case)
    if refused not in (None, boundary.pre):
        raise ValueError(f"the {boundary.pre} case at {boundary.key}, tp {tp}, breaks {refused} too")
    idle = sorted(set(range(tp)) - set(case_owners(case)))
    where = f"ranks {idle} own nothing" if idle else "every rank owns a request"
    return replace(
        case,
        case_id=f"tp{tp}-reject-{boundary.pre.removeprefix('PRE-').lower()}-at-{boundary.slug}",
        description=f"Violates {boundary.pre} at {', '.join(boundary.fields)} ({boundary.side}: {boundary.value}); "
        f"{where}.",
        spec_refs=[boundary.pre, "INV-REJECT-INVALID", "CL-REJECTION-RANKS"],
    )


def applies_at(boundary: Boundary, tp: int, profile: str) -> bool:
    """Whether a case can break ``boundary`` at group size ``tp``: under a profile that builds no sharder of
    that size (PRE-TP-SIZE) only that precondition can, and PRE-CAPACITY-TP needs two ranks or more."""
    if boundary.pre == "PRE-TP-SIZE":
        return tp == 1
    if boundary.pre == "PRE-CAPACITY-TP":
        return tp >= 2
    return tp >= rules_of(profile).min_tp


def boundary_cases(profile: str = DEFAULT_PROFILE, tp_sizes=TP_SIZES, seed: int = 0) -> list[Case]:
    """One case per (boundary, tp size) of every must-reject precondition that has a realizer."""
    out = []
    for boundary in boundaries(profile):
        for tp in tp_sizes:
            case = _case_for(boundary, tp, profile, seed)
            if case is not None:
                if not rules_of(case.profile).adaptive:
                    case = replace(case, adaptive_verification=False)
                out.append(case)
    return out


def boundary_cases_for_run(tp: int, profile: str = DEFAULT_PROFILE, seed: int = 0, run_tp_sizes=TP_SIZES) -> list[Case]:
    """The boundary cases a run of one seed over group sizes ``run_tp_sizes`` gives size ``tp``: each
    boundary goes to one of the run's sizes, rotating with the seed (boundary i to
    sizes[(i + seed) % len(sizes)]), so that one run checks every boundary once within its time budget
    and as many seeds as sizes check each at every size. All of them at every tp are
    :func:`boundary_cases`."""
    sizes = sorted(set(run_tp_sizes))
    if tp not in sizes:
        return []
    made = [b for b in boundaries(profile) if b.key in REALIZERS]
    mine = []
    for i, b in enumerate(made):
        where = [size for size in sizes if applies_at(b, size, profile)]  # the sizes a case of it exists at
        if where and where[(i + seed) % len(where)] == tp:
            mine.append(b)
    cases = [c for c in (_case_for(b, tp, profile, seed) for b in mine) if c is not None]
    return [c if rules_of(c.profile).adaptive else replace(c, adaptive_verification=False) for c in cases]


# Sizes of the data model a length is stated in (spec/data_model.yaml): a sequence stated to have one of
# them is violated on both sides, one entry short ("<size> - 1") and one long ("<size> + 1"). A sharder's
# construction parameters are scalars: "num_reqs - 1" there is a capacity, one side of a range.
LENGTH_SIZES = ("N", "L", "n", "L_local", "G", "G * S", "R", "num_reqs")
_LENGTH = re.compile(r"^(?P<size>.+) (?P<sign>[-+]) 1$")
# Lengths stated in entries rather than a size minus one.
_OTHER_SIDE = {"N entries": "N + 2 entries", "N + 2 entries": "N entries"}


def one_sided(found: list[Boundary]) -> list[tuple[str, str, str]]:
    """(precondition, field, the missing value) for every length violated on one side only."""
    stated = {(b.pre, b.fields[0], b.value) for b in found}
    gaps = []
    for pre, field, value in sorted(stated):
        other = _OTHER_SIDE.get(value)
        length = _LENGTH.match(value)
        if other is None and length and length["size"] in LENGTH_SIZES:
            other = f"{length['size']} {'+' if length['sign'] == '-' else '-'} 1"
        if other is not None and not field.startswith("sharder.") and (pre, field, other) not in stated:
            gaps.append((pre, field, other))
    return gaps


def missing(profile: str = DEFAULT_PROFILE) -> list[Boundary]:
    """The boundaries no case can be made for yet."""
    return [b for b in boundaries(profile) if b.key not in REALIZERS]
