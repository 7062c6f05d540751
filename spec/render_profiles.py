"""The "Profiles" section of SPEC.md: the profiles, every rule's value in each, and one table per
difference between them.

An entry (invariant, precondition, clarification) or a data-model field that ``requires`` rule values
holds for the profiles whose rules have them. Where an ID or a field has one entry per rule value, its
table puts the versions side by side, each with the rule values it requires and the profiles that have
them.
"""

from __future__ import annotations

from shardspec.spec.documents import FieldSpec, Spec, requires_text
from shardspec.spec.rules import RULES


def _profile_cell(entry, every: tuple[str, ...]) -> str:
    if not entry.requires:
        return ", ".join(every) + " (every profile)"
    return f"{requires_text(entry.requires)} ({', '.join(entry.profiles) or 'no bundled profile'})"


def _rules_table(spec: Spec, table) -> list[str]:
    """One row per rule: what it decides, and its value in each profile (inherited values in italics)."""
    header = ["rule", "what it decides", *(f"`{p.name}`" for p in spec.profiles)]
    rows = []
    for rule in RULES:
        rows.append([f"`{rule.name}`", rule.doc, *(getattr(p.rules, rule.name) for p in spec.profiles)])
    return table(header, rows)


def _values_table(table) -> list[str]:
    rows = [
        [f"`{rule.name}`", f"`{value}`", doc + (" Not supported yet." if value in rule.unsupported else "")]
        for rule in RULES
        for value, doc in rule.values.items()
    ]
    return table(["rule", "value", "meaning"], rows)


def _entry_text(entry) -> str:
    for name in ("statement", "decision"):
        if hasattr(entry, name):
            return getattr(entry, name)
    return ""


def entry_differences(spec: Spec) -> list[tuple[str, list]]:
    """(ID, its entries) for every ID that has a profile-specific entry, in document order."""
    entries = [*spec.invariants, *spec.preconditions, *spec.clarifications]
    order = list(dict.fromkeys(e.id for e in entries if e.profiles))
    return [(entry_id, [e for e in entries if e.id == entry_id]) for entry_id in order]


def field_differences(spec: Spec) -> list[tuple[str, list[FieldSpec]]]:
    """(Type.field, its entries) for every data-model field with a profile-specific entry."""
    found: dict[str, list[FieldSpec]] = {}
    groups = [(t.name, t.fields) for t in spec.data_model.types]
    groups += [("arguments", spec.data_model.arguments), ("outputs", spec.data_model.outputs)]
    for arg in spec.data_model.arguments:
        groups.append((f"arguments.{arg.name}", arg.fields))
    for owner, fields in groups:
        for f in fields:
            if f.profiles or any(g.name == f.name and g.profiles for g in fields):
                found.setdefault(f"{owner}.{f.name}", []).append(f)
    return list(found.items())


def _field_text(f: FieldSpec) -> str:
    parts = [f"{f.type} {f.dtype or ''}".strip(), "[" + ", ".join(f.shape) + "]" if f.shape else ""]
    if f.local is not None:
        local = " ".join(x for x in (f.local.scope, f.local.dtype or "", ",".join(f.local.shape or ())) if x)
        parts.append(f"local: {local}")
    return "; ".join(p for p in parts if p) + f". {f.meaning}"


def render_profiles(spec: Spec, table, link, number: int) -> list[str]:
    every = tuple(p.name for p in spec.profiles)
    lines = [
        f"## {number}. Profiles",
        "",
        "A profile names one upstream contract and is a set of rules: a file, `spec/profiles/<name>.yaml`, "
        "that names the profile it `extends` and the rules it changes. Every entry and field holds for "
        "every profile unless it `requires` rule values; an ID with one entry per rule value names one "
        "rule whose text differs by profile. Select one with `--profile NAME` (the CLI), "
        "`--shardspec-profile NAME` (the pytest plugin) or `SHARDSPEC_PROFILE`, or pass a profile file of "
        "your own that extends a bundled one with `--profile-file FILE` (`--shardspec-profile-file`, "
        "`SHARDSPEC_PROFILE_FILE`); every report names it.",
        "",
    ]
    lines += table(
        ["profile", "extends", "upstream", "meaning"],
        [
            [f"`{p.name}`" + (" (default)" if p.default else ""), p.extends or "", p.upstream, p.meaning]
            for p in spec.profiles
        ],
    )
    lines += ["The rules of each profile:", "", *_rules_table(spec, table)]
    lines += ["What each value means:", "", *_values_table(table)]
    lines += [f"### {number}.1 Entries that differ by rule", ""]
    for entry_id, entries in entry_differences(spec):
        lines += [f"#### {link(entry_id)}", ""]
        lines += table(["requires (profiles)", "text"], [[_profile_cell(e, every), _entry_text(e)] for e in entries])
    lines += [f"### {number}.2 Data-model fields that differ by rule", ""]
    for name, fields in field_differences(spec):
        lines += [f"#### `{name}`", ""]
        lines += table(["requires (profiles)", "field"], [[_profile_cell(f, every), _field_text(f)] for f in fields])
    return lines
