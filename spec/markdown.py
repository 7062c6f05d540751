"""The Markdown of SPEC.md: anchors and links for IDs, table cells, code lists and shapes.

Every ID gets the anchor of its lower-cased text; a profile's own version of an ID gets the ID's
anchor and the profiles' names, and links always go to the ID's first entry.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from shardspec.spec.documents import requires_text


def anchor(entry_id: str) -> str:
    return entry_id.lower()


def entry_anchor(entry) -> str:
    """An entry's anchor: its ID's, or for a profile's own version of an ID, the ID's and the profiles'
    (for a version no bundled profile selects, the rule values it requires)."""
    if entry.profiles:
        return anchor(entry.id) + "--" + "-".join(entry.profiles)
    if entry.requires:
        return anchor(entry.id) + "--" + re.sub(r"[^a-z0-9_]+", "-", requires_text(entry.requires)).strip("-")
    return anchor(entry.id)


def anchors(entry, seen: set) -> str:
    """The anchor lines of an entry: its own, and its ID's where it is the ID's first entry (links go there)."""
    own = entry_anchor(entry)
    names = [own] if own == anchor(entry.id) or anchor(entry.id) in seen else [anchor(entry.id), own]
    seen.update(names)
    return "".join(f'<a id="{name}"></a>' for name in names)


def profile_tag(entry) -> str:
    if entry.profiles:
        return f" · profile {', '.join(entry.profiles)}"
    return f" · {requires_text(entry.requires)} (no bundled profile)" if entry.requires else ""


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
