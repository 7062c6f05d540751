"""Render the specification documents into one readable ``SPEC.md``.

    python -m shardspec.spec.render            # (re)write spec/SPEC.md
    python -m shardspec.spec.render --check    # exit 1 with a diff if it is stale

The output depends only on the YAML documents, so it is byte-for-byte
reproducible and can be checked in CI.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterable
from itertools import accumulate
from pathlib import Path

from shardspec.spec.loader import FieldSpec, Spec, TypeSpec, load_spec
from shardspec.spec.render_profiles import render_profiles

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "SPEC.md"
STEPS = ("shard", "all_to_all", "gather", "step")
STEP_TITLES = {
    "shard": "shard (`shard_sampler_inputs`)",
    "all_to_all": "all_to_all (`all_to_all_logits`)",
    "gather": "gather (`gather_sampler_output`)",
    "step": "the whole step",
}


def anchor(entry_id: str) -> str:
    return entry_id.lower()


def entry_anchor(entry) -> str:
    """An entry's anchor: its ID's, or for a profile's own version of an ID, the ID's and the profiles'."""
    return anchor(entry.id) + ("--" + "-".join(entry.profiles) if entry.profiles else "")


def anchors(entry, seen: set) -> str:
    """The anchor lines of an entry: its own, and its ID's where it is the ID's first entry (links go there)."""
    own = entry_anchor(entry)
    names = [own] if own == anchor(entry.id) or anchor(entry.id) in seen else [anchor(entry.id), own]
    seen.update(names)
    return "".join(f'<a id="{name}"></a>' for name in names)


def profile_tag(entry) -> str:
    return f" · profile {', '.join(entry.profiles)}" if entry.profiles else ""


def link(entry_id: str) -> str:
    return f"[{entry_id}](#{anchor(entry_id)})"


# An ID in prose; not one that is already the text of a link.
_ID = re.compile(r"(?<![\[\w-])(?:INV|PRE|CL)-[A-Z0-9]+(?:-[A-Z0-9]+)*(?![\]\w-])")


def linkify(text: str, ids: frozenset) -> str:
    """Link every known ID that prose mentions, outside `code spans`."""
    parts = text.split("`")
    for k in range(0, len(parts), 2):
        parts[k] = _ID.sub(lambda m: link(m.group()) if m.group() in ids else m.group(), parts[k])
    return "`".join(parts)


def cell(text) -> str:
    """Text that is safe inside one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def code_list(names: Iterable[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def table(header: list[str], rows: Iterable[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines + [""]


def shape_text(shape: tuple[str, ...] | None) -> str:
    return "[" + ", ".join(shape) + "]" if shape else ""


# ------------------------------------------------------------------ overview


def render_overview(spec: Spec) -> list[str]:
    lines = ["## 1. Overview", ""]
    for title, body in spec.sections:
        lines += [f"### {title}", "", body, ""]
    return lines + render_example(spec.example)


def render_example(ex: dict) -> list[str]:
    tp, M, W = ex["tp"], ex["max_num_reqs_per_rank"], ex["max_num_logits_per_req"]
    cu = [0, *accumulate(ex["num_logits_per_req"])]
    qsl = ex["query_start_loc"]
    lines = [
        f"### {ex['title']}",
        "",
        f"A batch of {len(ex['slots'])} requests on tp = {tp} ranks, with speculative decoding "
        f"(L = {cu[-1]} logits rows).",
        "",
    ]
    lines += table(
        ["request i", "slot", "n_i", "query tokens", "logits rows", "logits_indices", "owner = slot mod tp"],
        [
            [
                i,
                slot,
                n,
                f"{qsl[i]}..{qsl[i + 1] - 1}",
                f"{cu[i]}..{cu[i + 1] - 1}",
                ex["logits_indices"][cu[i] : cu[i + 1]],
                ex["owners"][i],
            ]
            for i, (slot, n) in enumerate(zip(ex["slots"], ex["num_logits_per_req"], strict=False))
        ],
    )
    splits = ex["num_logits_per_rank"]
    starts = [0, *accumulate(splits)]
    lines += [
        f"- Owner-sorted requests: {ex['owner_sorted_reqs']}; `sorted_logits_indices` = {ex['sorted_logits_indices']}.",
        f"- `num_logits_per_rank` = {splits}: owner-sorted rows "
        + "; ".join(f"{starts[r]}..{starts[r + 1] - 1} go to rank {r}" for r in range(tp))
        + ".",
        "- After the all-to-all, rank r holds `[num_logits_per_rank[r], tp * Vs]`: "
        + ", ".join(f"rank {r} `[{splits[r]}, {tp} * Vs]`" for r in range(tp))
        + ".",
        f"- M = `max_num_reqs_per_rank` = {M}, W = `max_num_logits_per_req` = {W}; "
        f"`gathered_src_indices` = {ex['gathered_src_indices']}.",
        "",
        f"Sampled-output all-gather: each rank sends int64 `[M, W + 2 + g]` = `[{M}, {W + 2} + g]`; "
        f"gathered row `r * M + j` is rank r's row j.",
        "",
    ]
    lines += table(
        ["rank", "wire row j", "gathered row", "carries"],
        [
            [r, j, r * M + j, "padding" if req is None else f"request {req}"]
            for r, rows in enumerate(ex["wire_sampled_rows"])
            for j, req in enumerate(rows)
        ],
    )
    lines += [
        f"With logprobs, each rank sends `[M * W, C + 1]` int64 ids and `[M * W, C]` float32 values "
        f"({M * W} rows); row `j * W + p` is the p-th logits row of local request j.",
        "",
    ]
    lines += table(
        ["rank", f"wire rows 0..{M * W - 1}: (request, position) or pad"],
        [
            [r, ", ".join("pad" if item is None else f"({item[0]}, {item[1]})" for item in rows)]
            for r, rows in enumerate(ex["wire_logprob_rows"])
        ],
    )
    return lines


# ---------------------------------------------------------------- data model


def render_data_model(spec: Spec) -> list[str]:
    model = spec.data_model
    lines = ["## 2. Data model", "", "### Symbols", ""]
    lines += table(["symbol", "meaning"], [[f"`{s.name}`", s.meaning] for s in model.symbols])
    lines += ["### Types", ""]
    for type_spec in model.types:
        lines += render_type(type_spec)
    lines += ["### Arguments of the operations", ""]
    lines += field_table(model.arguments, with_step=True)
    for arg in model.arguments:
        if arg.fields:
            lines += [f"`{arg.name}` fields:", ""] + field_table(arg.fields)
    lines += [
        "### Outputs by step",
        "",
        "Invariants name these outputs (and the sub-fields of expanded ones) in their `fields`.",
        "",
    ]
    for step in STEPS:
        outputs = [o for o in model.outputs if o.step == step]
        lines += [f"#### Step: {STEP_TITLES[step]}", ""] + field_table(outputs)
        for out in outputs:
            if out.layout:
                lines += [
                    f"- **`{out.name}`** — sent {_shape_and_dtype(out)}, received "
                    f"`{shape_text(out.received_shape)}`. {' '.join(out.layout.split())}"
                ]
        lines += [""] if any(o.layout for o in outputs) else []
    return lines


def _shape_and_dtype(spec: FieldSpec) -> str:
    return f"{spec.dtype} `{shape_text(spec.shape)}`"


def render_type(type_spec: TypeSpec) -> list[str]:
    python = f" (Python: `{type_spec.python}`)" if type_spec.python else ""
    lines = [f"#### {type_spec.name}{python}", "", type_spec.meaning, ""]
    if any(f.local for f in type_spec.fields):
        rows = [
            [f"`{f.name}`", _type_text(f), shape_text(f.shape), f.placement, _local_text(f), f.meaning]
            for f in type_spec.fields
        ]
        return lines + table(["field", "type", "shape", "placement", "local batch", "meaning"], rows)
    return lines + field_table(type_spec.fields)


def field_table(fields: Iterable[FieldSpec], with_step: bool = False) -> list[str]:
    header = ["field", "type", "shape", "placement", "meaning"]
    rows = []
    for f in fields:
        row = [f"`{f.name}`", _type_text(f), shape_text(f.shape), f.placement, f.meaning]
        rows.append([row[0], f.step, *row[1:]] if with_step else row)
    return table([header[0], "step", *header[1:]] if with_step else header, rows)


def _type_text(f: FieldSpec) -> str:
    text = f.ref if f.ref else (f"{f.type} {f.dtype}" if f.dtype else f.type)
    return f"{text} or None" if f.optional else text


def _local_text(f: FieldSpec) -> str:
    local = f.local
    parts = [local.scope]
    if local.dtype:
        parts.append(local.dtype)
    if local.shape:
        parts.append(shape_text(local.shape))
    text = " ".join(parts)
    return f"{text}; {local.note}" if local.note else text


# ------------------------------------------------------- the three catalogues


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


def render(spec: Spec) -> str:
    lines = [
        f"# {spec.title}",
        "",
        f"Specification `{spec.name}` version **{spec.version}**.",
        "",
        "<!-- Generated by `python -m shardspec.spec.render` from spec/*.yaml; do not edit by hand. -->",
        "",
        "Contents: 1. Overview · 2. Data model · 3. Preconditions · 4. Invariants · "
        "5. Clarifications · 6. Index of identifiers · 7. Profiles",
        "",
    ]
    for part in (
        render_overview,
        render_data_model,
        render_preconditions,
        render_invariants,
        render_clarifications,
        render_id_index,
    ):
        lines += part(spec)
    lines += render_profiles(spec, table, link, 7)
    ids = frozenset(spec.ids)
    lines = [line if line.startswith(("#", "<a ")) else linkify(line, ids) for line in lines]
    return "\n".join(lines).rstrip("\n") + "\n"


# ----------------------------------------------------------------------- CLI


def check(expected: str, path: Path) -> tuple[bool, str]:
    """Whether ``path`` holds ``expected``; otherwise a unified diff (current -> expected)."""
    current = path.read_text(encoding="utf-8") if path.is_file() else ""
    if current == expected:
        return True, ""
    diff = difflib.unified_diff(
        current.splitlines(keepends=True),
        expected.splitlines(keepends=True),
        fromfile=f"{path} (current)",
        tofile=f"{path} (rendered)",
    )
    return False, "".join(diff)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shardspec.spec.render", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 with a diff if the output file is stale")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="default: spec/SPEC.md")
    parser.add_argument("--root", type=Path, default=None, help="spec directory to read (default: the package's)")
    args = parser.parse_args(argv)
    text = render(load_spec(args.root))
    if args.check:
        fresh, diff = check(text, args.output)
        if not fresh:
            sys.stdout.write(diff)
            print(f"{args.output} is stale: run python -m shardspec.spec.render", file=sys.stderr)
        return 0 if fresh else 1
    args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
