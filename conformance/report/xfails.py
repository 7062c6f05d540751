"""The xfails file of a run (--xfails-file): what it expects to fail, by invariant, case id or, under
``known_failures``, invariant plus properties of the case (known_failures.py); which failures it covers and
with which reason, and which of its entries went stale in a run.
"""

from __future__ import annotations

import pathlib
import stat
from dataclasses import dataclass, field

import yaml

from shardspec.conformance.report import known_failures
from shardspec.conformance.report.known_failures import KnownFailure
from shardspec.conformance.report.model import known_reason

KNOWN_FAILURES = "known_failures"  # an xfails file's list of entries keyed by properties (known_failures.py)


@dataclass
class Xfails:
    entries: dict[str, str] = field(default_factory=dict)  # id -> reason
    used: set[str] = field(default_factory=set)
    # id -> the input layouts it is limited to: the entry covers only cases that pass some input in one of
    # them (`only_with_layouts`), so a failure of the same invariant on contiguous inputs still fails.
    layouts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Entries keyed by invariant and properties of the case (the file's `known_failures`).
    known: list[KnownFailure] = field(default_factory=list)

    def covers(self, invariant_id: str, result) -> bool:
        for key in (invariant_id, result.case_id):
            if key in self.entries and self._in_scope(key, result):
                self.used.add(key)
                return True
        return any([item.covers(invariant_id, result) for item in self.known])  # every matching item is used

    def reason_of(self, invariant_id: str, result) -> str | None:
        """Why ``invariant_id`` ("" for a run error) failing in ``result`` is expected: the reason of the
        first entry or item that covers it (an item's ``why`` first), or None where none does."""
        for key in (invariant_id, result.case_id):
            if key in self.entries and self._in_scope(key, result):
                return self.entries[key]
        item = next((item for item in self.known if item.covers(invariant_id, result)), None)
        return None if item is None else known_reason(item.why, item.reason)

    def _in_scope(self, key: str, result) -> bool:
        scope = self.layouts.get(key)
        if not scope:
            return True
        case = getattr(result, "case", None)
        return any(layout in scope for layout in (getattr(case, "layouts", None) or {}).values())

    def warnings(self, known_ids: set[str], case_ids: set[str], shown: int = 20) -> list[str]:
        """A line per stale entry, ``shown`` of each kind at the most, then one line for the rest."""
        unknown = [e for e in self.entries if e not in known_ids and e not in case_ids]
        unused = [e for e in self.entries if e not in self.used and e not in unknown]
        out = [f"xfails entry {entry!r} matches no invariant and no case of this run" for entry in unknown[:shown]]
        if len(unknown) > shown:
            out.append(f"and {len(unknown) - shown} more xfails entries that match no invariant and no case")
        out += [f"xfails entry {entry!r} did not fail in this run (remove it?)" for entry in unused[:shown]]
        if len(unused) > shown:
            out.append(f"and {len(unused) - shown} more xfails entries that did not fail in this run")
        stale = known_failures.stale(self.known, known_ids)
        out += stale[:shown]
        if len(stale) > shown:
            out.append(f"and {len(stale) - shown} more known failures that are stale")
        return out


def _reason(value) -> str:
    """An entry's reason: a string, or a mapping's ``why`` (with ``kind`` and ``only_with_layouts``)."""
    if isinstance(value, dict):
        return str(value.get("why") or "")
    return str(value or "")


def _scoped(value) -> bool:
    if not isinstance(value, dict) or "only_with_layouts" not in value:
        return False
    layouts = value["only_with_layouts"]
    if not isinstance(layouts, list) or not all(isinstance(x, str) for x in layouts):
        raise ValueError(f"only_with_layouts: {layouts!r} is not a list of layout names")
    return True


# An xfails file lists what a run expects to fail: invariants and a few cases, not a load test (a file of
# megabytes cost minutes of parsing and a warning line per entry).
MAX_XFAILS_BYTES = 256 << 10
MAX_XFAILS_ENTRIES = 2000


def load_xfails(path: str | None) -> Xfails:
    """YAML (a list of ids, or a mapping id -> reason, with entries keyed by properties under
    ``known_failures``) or plain text, one id per line, # comments. A ValueError for a file that is not a
    regular one, or larger than MAX_XFAILS_BYTES or MAX_XFAILS_ENTRIES."""
    if not path:
        return Xfails()
    text = _bounded_text(pathlib.Path(path))
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        data = None
    if isinstance(data, dict):
        known = known_failures.parse(data.pop(KNOWN_FAILURES)) if KNOWN_FAILURES in data else []
        xfails = Xfails(
            {str(k): _reason(v) for k, v in data.items()},
            layouts={str(k): tuple(v["only_with_layouts"]) for k, v in data.items() if _scoped(v)},
            known=known,
        )
    elif isinstance(data, list):
        xfails = Xfails({str(item): "" for item in data})
    else:
        lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
        xfails = Xfails({line: "" for line in lines if line})
    if len(xfails.entries) + len(xfails.known) > MAX_XFAILS_ENTRIES:
        raise ValueError(f"{len(xfails.entries) + len(xfails.known)} entries, more than {MAX_XFAILS_ENTRIES}")
    return xfails


def _bounded_text(path: pathlib.Path) -> str:
    found = path.stat()  # a link to a regular file is read: it is only read
    if not stat.S_ISREG(found.st_mode):
        raise ValueError("is a FIFO, not a regular file" if stat.S_ISFIFO(found.st_mode) else "is not a regular file")
    with open(path, "rb") as stream:
        data = stream.read(MAX_XFAILS_BYTES + 1)
    if len(data) > MAX_XFAILS_BYTES:
        raise ValueError(f"{found.st_size} bytes, more than an xfails file may have ({MAX_XFAILS_BYTES})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
