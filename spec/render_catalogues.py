"""Sections 3 to 6 of SPEC.md: the preconditions, the invariants by step, the clarifications, and the
index of every identifier."""

from __future__ import annotations

from shardspec.spec.loader import Spec
from shardspec.spec.markdown import anchors, code_list, link, profile_tag, table
from shardspec.spec.render_model import STEP_TITLES, STEPS


def _outcome_text(pre) -> str:
    if pre.must_reject:
        return (
            f"MUST be rejected with an error naming the ID (the reference raises `{pre.error}`), raised on "
            f"{pre.on_violation.raised_on}"
        )
    return "undefined (the caller's fault); an implementation MAY reject it"


def render_preconditions(spec: Spec) -> list[str]:
    lines = [
        "## 3. Preconditions",
        "",
        "The caller guarantees these. For each one the spec decides what happens when it does not "
        "hold. **Rejected**: the operation raises an exception naming the ID (e.g. `[PRE-SLOT-RANGE]`; "
        "the reference raises `PreconditionError` with the field and, where known, the request and rank) "
        "before it writes any output or issues any collective of that operation (INV-REJECT-INVALID). "
        "**Undefined**: the caller's fault; outputs are unspecified, and an implementation that rejects "
        "it anyway SHOULD name the ID (INV-REJECT-NAMES-PRECONDITION).",
        "",
    ]
    lines += table(
        ["ID", "step", "on violation", "raised on", "profiles"],
        [
            [link(p.id), p.step, p.on_violation.outcome, p.on_violation.raised_on or "", ", ".join(p.profiles) or "all"]
            for p in spec.preconditions
            if not p.retired
        ],
    )
    seen: set = set()
    for pre in spec.preconditions:
        lines += [
            anchors(pre, seen),
            f"#### {pre.id} · {pre.level} · step {pre.step}{profile_tag(pre)}",
            "",
            pre.statement,
            "",
        ]
        if pre.rationale:
            lines += [f"*Why:* {pre.rationale}", ""]
        lines += [
            f"*On violation:* {_outcome_text(pre)}. {' '.join(pre.on_violation.reason.split())}",
            "",
            f"*Fields:* {code_list(pre.fields)} · *Error:* `{pre.error}`",
            "",
        ]
    return lines


def render_invariants(spec: Spec) -> list[str]:
    lines = ["## 4. Invariants", ""]
    seen: set = set()
    for step in STEPS:
        lines += [f"### Step: {STEP_TITLES[step]}", ""]
        for inv in (i for i in spec.invariants if i.step == step):
            retired = " · retired" if inv.retired else ""
            lines += [
                anchors(inv, seen),
                f"#### {inv.id} · {inv.level}{retired}{profile_tag(inv)}",
                "",
                inv.statement,
                "",
                f"*Why:* {inv.rationale}",
                "",
                f"*Fields:* {code_list(inv.fields)}",
                "",
            ]
    return lines


def render_clarifications(spec: Spec) -> list[str]:
    lines = [
        "## 5. Clarifications",
        "",
        "Points the upstream implementation leaves open, and what this specification decides.",
        "",
    ]
    seen: set = set()
    for cl in spec.clarifications:
        lines += [
            anchors(cl, seen),
            f"### {cl.id} — {cl.topic}{profile_tag(cl)}",
            "",
            f"**Question.** {cl.question}",
            "",
            f"**Decision.** {cl.decision}",
            "",
            f"**Why.** {cl.rationale}",
            "",
            f"**Enforced by:** {', '.join(link(i) for i in cl.enforced_by)}",
            "",
        ]
    return lines


def render_id_index(spec: Spec) -> list[str]:
    rows = [[link(i.id), "invariant", i.level, i.step] for i in spec.invariants]
    rows += [[link(p.id), "precondition", p.level, p.step] for p in spec.preconditions]
    rows += [[link(c.id), "clarification", "", c.topic] for c in spec.clarifications]
    rows = sorted({row[0]: row for row in rows}.values(), key=lambda row: row[0])  # an ID once
    return ["## 6. Index of identifiers", ""] + table(["ID", "kind", "level", "step / topic"], rows)
