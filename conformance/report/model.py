"""Conformance JSON reports, read back: parsing and validation.

Reads what ``python -m shardspec.conformance --json`` writes (see
``report.json_report``). The format is expected to grow, so optional fields
are used when present and derived when absent:

- a table cell may be a string (``"FAIL 2"``) or a mapping
  ``{"verdict": "fail", "judged": 27}``; a row may carry ``"judged": {tp: n}``;
- a violation may carry its ``"level"`` (else the spec's level of its invariant);
- a case may carry ``"case_yaml"``, its (minimal) case as YAML (else the file
  its reproduce command names, when that file still exists), and ``"judged"``,
  the invariants it judged;
- cells may read ``"n/a"``; sections may list ``"not_applicable"`` sizes and, per size, the
  ``"input_coverage"`` their cases drew.

Anything that is not a conformance report raises :class:`ReportError` with one
line naming the file and what is wrong.
"""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import stat
from dataclasses import dataclass, field
from typing import Any

from shardspec.conformance.output_paths import MAX_REPORT_BYTES

FAIL, WARN, XFAIL, PASS, NA, NOT_RUN, UNKNOWN = "fail", "warn", "xfail", "pass", "n/a", "not-run", "unknown"
JUDGED = (PASS, FAIL, WARN, XFAIL)  # verdicts that say something was checked
FAILING = (FAIL, WARN, XFAIL)  # verdicts with failing cases to show
MAX_CASE_YAML = 64_000  # characters of a case file embedded in the page
# A known failure's ``why`` (an xfails file's ``known_failures``): the spec asks for something the
# implementation never promised; any ``<engine>-defect`` (``vllm-defect``) is a defect of the implementation.
SPEC_CHOICE = "spec-choice"


class ReportError(ValueError):
    """A conformance report that cannot be read; the message is one line."""


@dataclass(frozen=True)
class TableCell:
    verdict: str  # one of FAIL, WARN, XFAIL, PASS, NA, NOT_RUN, UNKNOWN
    text: str  # as the report wrote it
    count: int | None = None  # "FAIL 6": cases counted by the special rows
    judged: int | None = None  # cases judged, when the report says


@dataclass(frozen=True)
class CaseRecord:
    case_id: str
    tp: int
    status: str  # pass | fail | error | not-run
    violations: tuple[dict[str, Any], ...] = ()
    errors: tuple[dict[str, Any], ...] = ()
    reason: str = ""
    reproduce: str = ""
    case_yaml: str | None = None
    judged: tuple[str, ...] | None = None  # the invariants this case judged, where the report says


@dataclass(frozen=True)
class DrawnInputs:
    """The input space one entry's cases drew at one size (report/input_coverage.py)."""

    variations: int
    covered: int
    not_covered: tuple[str, ...]
    left_out: tuple[tuple[str, str], ...] = ()  # pairs the space leaves out, and why (reports before: none)


@dataclass
class Section:
    """One implementation entry of one report."""

    implementation: str
    tp_sizes: list[int]
    not_applicable: dict[int, str]
    table: dict[str, dict[int, TableCell]]  # invariant id -> tp -> cell
    levels: dict[str, str]  # invariant id -> level, as the table says
    cases: list[CaseRecord]
    input_coverage: dict[int, DrawnInputs] = field(default_factory=dict)  # absent from reports before it
    # invariant id -> tp -> why its xfail cell is expected (the known failures' reasons; absent before it).
    known: dict[str, dict[int, tuple[str, ...]]] = field(default_factory=dict)
    # invariant id -> tp -> how many failing cases of its FAIL or warn cell no known failure covers (absent
    # from reports before it).
    untriaged: dict[str, dict[int, int]] = field(default_factory=dict)

    def cases_at(self, tp: int) -> list[CaseRecord]:
        return [c for c in self.cases if c.tp == tp]


@dataclass
class Report:
    name: str
    path: str
    metadata: dict[str, Any]
    sections: list[Section]
    warnings: list[str] = field(default_factory=list)
    exit_code: int | None = None
    # Each launch whose group never started: tp, launch, reason, log, error (absent from reports before it).
    launch_failures: list[dict[str, Any]] = field(default_factory=list)

    def section(self, implementation: str) -> Section | None:
        return next((s for s in self.sections if s.implementation == implementation), None)


def parse_verdict(raw: Any) -> TableCell:
    """A cell as the report wrote it -> its verdict (and the count of the special rows)."""
    if isinstance(raw, dict):
        inner = parse_verdict(raw.get("verdict", raw.get("result", "")))
        judged = raw.get("judged")
        return TableCell(inner.verdict, inner.text, inner.count, judged if isinstance(judged, int) else None)
    text = str(raw).strip()
    words = text.split()
    first = words[0].lower() if words else ""
    count = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
    if first.isdigit():  # the "(cases not run)" row writes how many did not run
        return TableCell(PASS if int(first) == 0 else FAIL, text, int(first))
    verdict = {"pass": PASS, "fail": FAIL, "warn": WARN, "xfail": XFAIL, "n/a": NA, "not-run": NOT_RUN}.get(first)
    return TableCell(verdict or UNKNOWN, text, count)


# -- loading -----------------------------------------------------------------


def load_report(path: str | pathlib.Path, name: str | None = None) -> Report:
    path = pathlib.Path(path)
    try:
        found = path.stat()
        if not stat.S_ISREG(found.st_mode):
            kind = "a FIFO, not a regular file" if stat.S_ISFIFO(found.st_mode) else "not a regular file"
            raise ReportError(f"{path}: is {kind}")
        if found.st_size > MAX_REPORT_BYTES:
            raise ReportError(f"{path}: {found.st_size} bytes, more than a report is read to ({MAX_REPORT_BYTES})")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot be read ({exc.__class__.__name__}: {exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    return parse_report(data, str(path), name or path.stem)


def parse_report(data: Any, path: str, name: str) -> Report:
    if not isinstance(data, dict) or not isinstance(data.get("sections"), list):
        raise ReportError(f"{path}: not a conformance report (no 'sections' list at the top level)")
    metadata = data.get("metadata") or {}
    _require(isinstance(metadata, dict), path, "metadata", "is not a mapping")
    sections = [_parse_section(s, path, f"sections[{i}]") for i, s in enumerate(data["sections"])]
    warnings = data.get("warnings") or []
    exit_code = data.get("exit_code")
    return Report(
        name=name,
        path=path,
        metadata=metadata,
        sections=sections,
        warnings=[str(w) for w in warnings] if isinstance(warnings, list) else [str(warnings)],
        exit_code=exit_code if isinstance(exit_code, int) else None,
        launch_failures=_launch_failures(data.get("launch_failures"), path),
    )


def _launch_failures(raw: Any, path: str) -> list[dict[str, Any]]:
    if raw is None:
        return []
    _require(
        isinstance(raw, list) and all(isinstance(f, dict) for f in raw),
        path,
        "launch_failures",
        "is not a list of mappings",
    )
    return [{key: str(f.get(key, "")) for key in ("tp", "launch", "reason", "log", "error")} for f in raw]


def _require(condition: bool, path: str, place: str, problem: str) -> None:
    if not condition:
        raise ReportError(f"{path}: not a conformance report ({place} {problem})")


def _parse_section(raw: Any, path: str, place: str) -> Section:
    _require(isinstance(raw, dict), path, place, "is not a mapping")
    label = raw.get("implementation")
    _require(isinstance(label, str) and bool(label), path, f"{place}.implementation", "is missing or not a string")
    tp_sizes = raw.get("tp_sizes")
    _require(
        isinstance(tp_sizes, list) and all(_is_int(t) for t in tp_sizes),
        path,
        f"{place}.tp_sizes",
        "is not a list of integers",
    )
    _require(isinstance(raw.get("table"), list), path, f"{place}.table", "is missing or not a list")
    _require(isinstance(raw.get("cases", []), list), path, f"{place}.cases", "is not a list")
    table, levels, known, untriaged = {}, {}, {}, {}
    for i, row in enumerate(raw["table"]):
        row_place = f"{place}.table[{i}]"
        _require(isinstance(row, dict) and isinstance(row.get("invariant"), str), path, row_place, "has no 'invariant'")
        _require(isinstance(row.get("results"), dict), path, f"{row_place}.results", "is not a mapping")
        judged = row.get("judged") if isinstance(row.get("judged"), dict) else {}
        cells = {}
        for tp, value in row["results"].items():
            _require(_is_int(tp), path, f"{row_place}.results", f"has a key {tp!r} that is not a tp size")
            cell = parse_verdict(value)
            if cell.judged is None and isinstance(judged.get(str(tp)), int):
                cell = TableCell(cell.verdict, cell.text, cell.count, judged[str(tp)])
            cells[int(tp)] = cell
        table[row["invariant"]] = cells
        levels[row["invariant"]] = str(row.get("level", "MUST"))
        known[row["invariant"]] = _parse_known(row.get("known"), path, f"{row_place}.known")
        untriaged[row["invariant"]] = _parse_untriaged(row.get("untriaged"), path, f"{row_place}.untriaged")
    cases = [_parse_case(c, path, f"{place}.cases[{i}]") for i, c in enumerate(raw.get("cases", []))]
    not_applicable = raw.get("not_applicable") or {}
    _require(
        isinstance(not_applicable, dict) and all(_is_int(t) for t in not_applicable),
        path,
        f"{place}.not_applicable",
        "is not a mapping of tp sizes",
    )
    na = {int(t): str(w) for t, w in not_applicable.items()}
    drawn = _parse_input_coverage(raw.get("input_coverage") or {}, path, f"{place}.input_coverage")
    known = {invariant: reasons for invariant, reasons in known.items() if reasons}
    untriaged = {invariant: counts for invariant, counts in untriaged.items() if counts}
    return Section(label, [int(t) for t in tp_sizes], na, table, levels, cases, drawn, known, untriaged)


def _parse_known(raw: Any, path: str, place: str) -> dict[int, tuple[str, ...]]:
    if raw is None:
        return {}
    _require(
        isinstance(raw, dict) and all(_is_int(t) and isinstance(r, list) for t, r in raw.items()),
        path,
        place,
        "is not a mapping of tp sizes to lists of reasons",
    )
    return {int(t): tuple(map(str, reasons)) for t, reasons in raw.items()}


def _parse_untriaged(raw: Any, path: str, place: str) -> dict[int, int]:
    if raw is None:
        return {}
    _require(
        isinstance(raw, dict) and all(_is_int(t) and _is_int(n) for t, n in raw.items()),
        path,
        place,
        "is not a mapping of tp sizes to counts",
    )
    return {int(t): int(n) for t, n in raw.items()}


def known_why(reason: str) -> str:
    """The ``why`` a known failure's reason starts with in the JSON report (``vllm-defect: ...``, see
    ``known_reason``), or "" for an entry that gives none (one keyed by invariant or case id)."""
    why, colon, _ = reason.partition(": ")
    return why if colon and (why == SPEC_CHOICE or (why.endswith("defect") and " " not in why)) else ""


def known_reason(why: str, reason: str) -> str:
    """A known failure's reason as the JSON report writes it: its ``why`` first (``known_why`` reads it)."""
    return f"{why}: {reason}"


def _parse_input_coverage(raw: Any, path: str, place: str) -> dict[int, DrawnInputs]:
    _require(isinstance(raw, dict), path, place, "is not a mapping of tp sizes")
    drawn = {}
    for tp, entry in raw.items():
        where = f"{place}[{tp!r}]"
        _require(_is_int(tp) and isinstance(entry, dict), path, where, "is not a tp size with a mapping")
        numbers = [entry.get("variations"), entry.get("covered")]
        _require(all(_is_int(n) for n in numbers), path, where, "has no integer 'variations' and 'covered'")
        missing = entry.get("not_covered", [])
        _require(isinstance(missing, list), path, f"{where}.not_covered", "is not a list")
        left_out = entry.get("left_out", {})
        _require(isinstance(left_out, dict), path, f"{where}.left_out", "is not a mapping")
        pairs = tuple((str(k), str(v)) for k, v in left_out.items())
        drawn[int(tp)] = DrawnInputs(int(numbers[0]), int(numbers[1]), tuple(map(str, missing)), pairs)
    return drawn


def _parse_case(raw: Any, path: str, place: str) -> CaseRecord:
    _require(isinstance(raw, dict), path, place, "is not a mapping")
    _require(isinstance(raw.get("case_id"), str), path, f"{place}.case_id", "is missing")
    _require(_is_int(raw.get("tp")), path, f"{place}.tp", "is missing or not an integer")
    violations = raw.get("violations") or []
    _require(
        isinstance(violations, list) and all(isinstance(v, dict) and "invariant_id" in v for v in violations),
        path,
        f"{place}.violations",
        "is not a list of violations with an 'invariant_id'",
    )
    errors = raw.get("errors") or []
    _require(
        isinstance(errors, list) and all(isinstance(e, dict) for e in errors),
        path,
        f"{place}.errors",
        "is not a list of mappings",
    )
    reproduce = str(raw.get("reproduce") or "")
    case_yaml = raw.get("case_yaml")
    judged = raw.get("judged")
    return CaseRecord(
        case_id=raw["case_id"],
        tp=int(raw["tp"]),
        status=str(raw.get("status", "")),
        violations=tuple(violations),
        errors=tuple(errors),
        reason=str(raw.get("reason") or ""),
        reproduce=reproduce,
        case_yaml=case_yaml if isinstance(case_yaml, str) else _case_file_text(reproduce),
        judged=tuple(map(str, judged)) if isinstance(judged, list) else None,
    )


def _is_int(value: Any) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        or (isinstance(value, str) and re.fullmatch(r"\d+", value) is not None)
    )


def _case_file_text(reproduce: str) -> str | None:
    """The case file a reproduce command names (``--case-file PATH``), if it is still there."""
    try:
        words = shlex.split(reproduce)
    except ValueError:
        return None
    if "--case-file" not in words or words.index("--case-file") + 1 >= len(words):
        return None
    case_file = pathlib.Path(words[words.index("--case-file") + 1])
    try:
        text = case_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):  # run folders are temporary: the command alone still helps
        return None
    return text if len(text) <= MAX_CASE_YAML else text[:MAX_CASE_YAML] + "\n# ... (cut)\n"


def report_names(paths: list[str]) -> list[str]:
    """Short distinct names for reports: the file's stem, or more of its path where stems repeat."""
    stems = [pathlib.Path(p).stem for p in paths]
    names = []
    for path, stem in zip(paths, stems, strict=True):
        if stems.count(stem) == 1:
            names.append(stem)
        else:
            parent = pathlib.Path(path).parent.name
            names.append(f"{parent}/{stem}" if parent else stem)
    return [name if names.count(name) == 1 else f"{name} ({i + 1})" for i, name in enumerate(names)]
