"""The "Profiles" section of SPEC.md: the profiles, and one table per difference between them.

An entry (invariant, precondition, clarification) or a data-model field that names ``profiles`` holds
for those profiles only. Where an ID or a field has one entry per profile, its table puts the versions
side by side; where it holds for some profiles only, the table says which.
"""

from __future__ import annotations

from shardspec.spec.documents import FieldSpec, Spec


def _profile_cell(names: tuple[str, ...], every: tuple[str, ...]) -> str:
    return ", ".join(names) if names else ", ".join(every) + " (every profile)"


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
        "A profile names one upstream contract. Every entry and field holds for every profile unless it "
        "names the profiles it holds for; an ID with one entry per profile names one rule whose text "
        "differs by profile. Select one with `--profile NAME` (the CLI), `--shardspec-profile NAME` "
        "(the pytest plugin) or `SHARDSPEC_PROFILE`; every report names it.",
        "",
    ]
    lines += table(
        ["profile", "upstream", "meaning"],
        [[f"`{p.name}`" + (" (default)" if p.default else ""), p.upstream, p.meaning] for p in spec.profiles],
    )
    lines += [f"### {number}.1 Entries that differ by profile", ""]
    for entry_id, entries in entry_differences(spec):
        lines += [f"#### {link(entry_id)}", ""]
        lines += table(["profile", "text"], [[_profile_cell(e.profiles, every), _entry_text(e)] for e in entries])
    lines += [f"### {number}.2 Data-model fields that differ by profile", ""]
    for name, fields in field_differences(spec):
        lines += [f"#### `{name}`", ""]
        lines += table(["profile", "field"], [[_profile_cell(f.profiles, every), _field_text(f)] for f in fields])
    return lines
