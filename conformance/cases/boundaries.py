"""Cases that violate each precondition at each boundary it states, at every tp size.

spec/preconditions.yaml gives every precondition ``boundaries``: the fields changed together, the side
of their range (``below``, ``above``, ``other``) and the value. :func:`boundary_cases` turns each
boundary of each precondition whose violation MUST be rejected into one case per tp size, from a
seeded valid batch; where the precondition is raised on every rank (replicated inputs), the batch
leaves ranks that own nothing, which must reject it too. A precondition raised only on the faulty
rank gets a batch in which every rank owns a request, so every rank is faulty and none is left in a
collective.

How a boundary becomes a case is :data:`REALIZERS` (cases/boundary_realizers.py), keyed by the boundary's
first field, side and value: the change of a valid batch that puts that field at that value. A boundary without a
realizer (one the case format cannot express yet, such as a host copy one entry short) yields no
case and is listed by :func:`missing`, so tests/meta sees every gap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from shardspec.conformance.cases.boundary_realizers import REALIZERS
from shardspec.conformance.cases.input_space import holds
from shardspec.spec.case import Case, case_owners, construction_refusal
from shardspec.spec.loader import _package_root, document_schema, load_yaml_document
from shardspec.spec.rules import Rules

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


def boundaries(rules: Rules) -> list[Boundary]:
    """Every boundary of every must-reject precondition under ``rules``, from the raw YAML."""
    raw = load_yaml_document(_package_root().joinpath("preconditions.yaml"), document_schema("preconditions"))
    out = []
    for entry in raw["preconditions"]:
        if entry.get("retired") or entry["on_violation"]["outcome"] != "reject":
            continue
        if not holds(entry, rules):
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


def _base(pre: str, tp: int, rng: np.random.Generator, every_rank_owns: bool, rules: Rules) -> Case:
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
        rules=rules,
        expect_error=pre,
    )


def _case_for(boundary: Boundary, tp: int, rules: Rules, seed: int) -> Case | None:
    realizer = REALIZERS.get(boundary.key)
    if realizer is None or not applies_at(boundary, tp, rules):
        return None
    rng = np.random.default_rng([seed, tp, sum(map(ord, boundary.pre + boundary.key))])
    every_rank_owns = boundary.raised_on != "every rank"
    base = _base(boundary.pre, tp, rng, every_rank_owns, rules)
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


def applies_at(boundary: Boundary, tp: int, rules: Rules) -> bool:
    """Whether a case can break ``boundary`` at group size ``tp``: under a profile that builds no sharder of
    that size (PRE-TP-SIZE) only that precondition can, and PRE-CAPACITY-TP needs two ranks or more."""
    if boundary.pre == "PRE-TP-SIZE":
        return tp == 1
    if boundary.pre == "PRE-CAPACITY-TP":
        return tp >= 2
    return tp >= rules.min_tp


def boundary_cases(rules: Rules, tp_sizes=TP_SIZES, seed: int = 0) -> list[Case]:
    """One case per (boundary, tp size) of every must-reject precondition that has a realizer."""
    out = []
    for boundary in boundaries(rules):
        for tp in tp_sizes:
            case = _case_for(boundary, tp, rules, seed)
            if case is not None:
                if not case.rules.adaptive:
                    case = replace(case, adaptive_verification=False)
                out.append(case)
    return out


def boundary_cases_for_run(tp: int, rules: Rules, seed: int = 0, run_tp_sizes=TP_SIZES) -> list[Case]:
    """The boundary cases a run of one seed over group sizes ``run_tp_sizes`` gives size ``tp``: each
    boundary goes to one of the run's sizes, rotating with the seed (boundary i to
    sizes[(i + seed) % len(sizes)]), so that one run checks every boundary once within its time budget
    and as many seeds as sizes check each at every size. All of them at every tp are
    :func:`boundary_cases`."""
    sizes = sorted(set(run_tp_sizes))
    if tp not in sizes:
        return []
    made = [b for b in boundaries(rules) if b.key in REALIZERS]
    mine = []
    for i, b in enumerate(made):
        where = [size for size in sizes if applies_at(b, size, rules)]  # the sizes a case of it exists at
        if where and where[(i + seed) % len(where)] == tp:
            mine.append(b)
    cases = [c for c in (_case_for(b, tp, rules, seed) for b in mine) if c is not None]
    return [c if c.rules.adaptive else replace(c, adaptive_verification=False) for c in cases]


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


def missing(rules: Rules) -> list[Boundary]:
    """The boundaries no case can be made for yet."""
    return [b for b in boundaries(rules) if b.key not in REALIZERS]
