"""The compliance matrix (invariants x implementation x tp) and the diff between two runs.

Rows are the spec's invariants grouped by step, then any invariant a report
checked that the spec does not list, then the run rows (``(run errors)``,
``(cases not run)``). Columns are every (report, implementation, tp size).
A cell holds the report's verdict, the number of cases judged and, for
failing cells, the failing cases with their messages.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from shardspec.conformance.report.model import (
    FAILING,
    JUDGED,
    NA,
    NOT_RUN,
    PASS,
    CaseRecord,
    Report,
    Section,
    TableCell,
)
from shardspec.conformance.report.summary import ERRORS_ROW, NOT_RUN_ROW

STEP_TITLES = {"shard": "shard", "all_to_all": "all-to-all", "gather": "gather", "step": "the whole step"}
OTHER_GROUP = "checked, not in this spec"
RUN_GROUP = "the run"
RUN_ROWS = (ERRORS_ROW, NOT_RUN_ROW)
CASES_PER_DETAIL = 10  # failing cases listed in one cell's detail; the JSON has all of them


@dataclass(frozen=True)
class Column:
    report: str
    implementation: str
    tp: int


@dataclass(frozen=True)
class Message:
    """One violation, the ranks that reported it merged."""

    level: str
    text: str
    where: str  # "ranks 0, 1, request 2, field gathered.sampled_token_ids"


@dataclass(frozen=True)
class FailingCase:
    case_id: str
    status: str
    messages: tuple[Message, ...]
    reproduce: str
    case_yaml: str | None


@dataclass
class Cell:
    column: Column
    verdict: str
    text: str
    judged: int | None
    failing_count: int = 0
    failing: list[FailingCase] = field(default_factory=list)
    detail_id: str | None = None  # set where the cell has a detail to open

    @property
    def label(self) -> str:
        """The cell's text: the verdict, and failing/judged or judged."""
        if self.verdict in (NA, NOT_RUN) or self.judged is None:
            return self.verdict
        if self.verdict in FAILING:
            return f"{self.verdict} {self.failing_count}/{self.judged}"
        return f"{self.verdict} {self.judged}"


@dataclass(frozen=True)
class CoverageCell:
    """The input space one column's cases drew: ``drawn/all``, and what no case drew."""

    column: Column
    text: str
    not_covered: tuple[str, ...] = ()
    detail_id: str | None = None


@dataclass
class Row:
    invariant_id: str
    level: str
    statement: str
    cells: list[Cell]


@dataclass
class RowGroup:
    title: str
    rows: list[Row]


@dataclass
class Matrix:
    columns: list[Column]
    groups: list[RowGroup]
    spec_version: str
    notes: list[str]
    profile: str = ""
    coverage: list[CoverageCell] = field(default_factory=list)  # one per column

    @property
    def rows(self) -> list[Row]:
        return [row for group in self.groups for row in group.rows]


def build_matrix(reports: list[Report], spec) -> Matrix:
    """``spec``: a loaded :class:`shardspec.spec.documents.Spec` (``shardspec.spec.loader.load_spec()``)."""
    columns = [Column(r.name, s.implementation, tp) for r in reports for s in r.sections for tp in s.tp_sizes]
    sections = {(r.name, s.implementation): s for r in reports for s in r.sections}
    invariants = [inv for inv in spec.invariants if not inv.retired]
    known = {inv.id for inv in invariants}
    checked = dict.fromkeys(i for s in sections.values() for i in s.table if i not in known and i not in RUN_ROWS)
    ids = itertools.count()
    row = _row_builder(columns, sections, ids)
    steps = dict.fromkeys(
        [*(s for s in STEP_TITLES if any(inv.step == s for inv in invariants)), *(inv.step for inv in invariants)]
    )  # the step's order first, then any new step
    groups = [
        RowGroup(
            STEP_TITLES.get(step, step),
            [row(inv.id, inv.level, _one_line(inv.statement)) for inv in invariants if inv.step == step],
        )
        for step in steps
    ]
    if checked:
        levels = {i: s.levels[i] for s in sections.values() for i in s.levels}
        groups.append(RowGroup(OTHER_GROUP, [row(i, levels.get(i, "MUST"), "") for i in checked]))
    groups.append(
        RowGroup(
            RUN_GROUP,
            [
                row(ERRORS_ROW, "MUST", "Every case ran to the end on every rank (no rank raised, hung or died)."),
                row(NOT_RUN_ROW, "MUST", "Every selected case was run."),
            ],
        )
    )
    notes = _version_notes(reports, spec.version) + _profile_notes(reports, spec.profile) + _left_out_notes(sections)
    return Matrix(columns, groups, spec.version, notes, spec.profile or "", _coverage_cells(columns, sections))


def _left_out_notes(sections: dict) -> list[str]:
    """One note naming the pairs the input space leaves out on purpose, and why (the same at every size)."""
    left_out = dict(
        pair for section in sections.values() for d in section.input_coverage.values() for pair in d.left_out
    )
    if not left_out:
        return []
    listed = "; ".join(f"{key} ({why})" for key, why in left_out.items())
    return [f"Input variations: {len(left_out)} pairs are left out of the input space on purpose: {listed}."]


def _coverage_cells(columns: list[Column], sections: dict) -> list[CoverageCell]:
    cells = []
    for k, column in enumerate(columns):
        section = sections[(column.report, column.implementation)]
        drawn = section.input_coverage.get(column.tp)
        if column.tp in section.not_applicable:
            cells.append(CoverageCell(column, NA))
        elif drawn is None:
            cells.append(CoverageCell(column, "not in this report"))
        else:
            detail = f"c{k}" if drawn.not_covered else None
            cells.append(CoverageCell(column, f"{drawn.covered}/{drawn.variations}", drawn.not_covered, detail))
    return cells


# The profile a report that names none was judged under (reports before spec 0.4).
UNNAMED_PROFILE = "vllm-seed"


def _profile_of(report: Report) -> str:
    return str(report.metadata.get("profile") or UNNAMED_PROFILE)


def report_profile(reports: list[Report]) -> str:
    """The profile the reports were judged under (the first report's; reports before spec 0.4 name
    none and were judged under what is now vllm-seed)."""
    return _profile_of(reports[0]) if reports else UNNAMED_PROFILE


def _profile_notes(reports: list[Report], profile: str | None) -> list[str]:
    other = [r.name for r in reports if _profile_of(r) != profile]
    if not other:
        return []
    return [f"{', '.join(other)}: judged under another profile than {profile}; the rows are those of {profile}"]


def _version_notes(reports: list[Report], spec_version: str) -> list[str]:
    by_version: dict[str, list[str]] = {}
    for report in reports:
        version = report.metadata.get("spec_version")
        if version is not None and str(version) != spec_version:
            by_version.setdefault(str(version), []).append(report.name)
    return [
        f"{', '.join(names)}: made against spec {version}; the rows are those of spec {spec_version}, "
        "so an invariant the run did not know reads not-run"
        for version, names in by_version.items()
    ]


def _one_line(statement: str) -> str:
    """The statement's first sentence (the spec folds statements over several lines)."""
    flat = " ".join(statement.split())
    end = flat.find(". ")
    return flat if end < 0 else flat[: end + 1]


def _row_builder(columns, sections, ids):
    def row(invariant_id: str, level: str, statement: str) -> Row:
        cells = [make_cell(sections[(c.report, c.implementation)], invariant_id, c) for c in columns]
        for cell in cells:
            if cell.failing:
                cell.detail_id = f"d{next(ids)}"
        return Row(invariant_id, level, statement, cells)

    return row


def make_cell(section: Section, invariant_id: str, column: Column) -> Cell:
    tp = column.tp
    if tp in section.not_applicable:
        return Cell(column, NA, section.not_applicable[tp], None)
    given = section.table.get(invariant_id, {}).get(tp)
    if given is None:  # the report has no such row (an invariant newer than the run)
        return Cell(column, NOT_RUN, "not in this report", 0)
    level = section.levels.get(invariant_id, "MUST")
    failing = failing_cases(section, invariant_id, tp, level) if given.verdict in FAILING else []
    count = given.count if given.count is not None else len(failing)
    text = "no case at this size could judge it" if given.verdict == NA else given.text
    cell = Cell(column, given.verdict, text, _judged(section, invariant_id, tp, given), count)
    cell.failing = failing[:CASES_PER_DETAIL]
    return cell


def _judged(section: Section, invariant_id: str, tp: int, given: TableCell) -> int | None:
    """The cases that judged the invariant at that size: from the cases' own lists where the report
    has them, else the table's count, else the cases that ran. The run rows count cases instead:
    those that ran, or those selected."""
    cases = section.cases_at(tp)
    if invariant_id in RUN_ROWS:
        return len(cases) if invariant_id == NOT_RUN_ROW else sum(c.status != NOT_RUN for c in cases)
    if given.verdict == NOT_RUN:
        return 0
    if cases and all(c.judged is not None for c in cases):
        # A case that reported a violation judged the invariant, even where it then ended in an error
        # (such cases carry no list of what they judged).
        return sum(invariant_id in c.judged or _violates(c, invariant_id) for c in cases)
    if given.judged is not None:
        return max(given.judged, sum(_violates(c, invariant_id) for c in cases))
    return None if given.verdict == NA else sum(c.status != NOT_RUN for c in cases)


def _violates(case: CaseRecord, invariant_id: str) -> bool:
    return any(v["invariant_id"] == invariant_id for v in case.violations)


def failing_cases(section: Section, invariant_id: str, tp: int, level: str) -> list[FailingCase]:
    if invariant_id == ERRORS_ROW:
        return [
            FailingCase(c.case_id, c.status, _error_messages(c), c.reproduce, c.case_yaml)
            for c in section.cases_at(tp)
            if c.status == "error"
        ]
    if invariant_id == NOT_RUN_ROW:
        return [
            FailingCase(c.case_id, c.status, (Message("MUST", c.reason or "not run", ""),), c.reproduce, None)
            for c in section.cases_at(tp)
            if c.status == NOT_RUN
        ]
    found = []
    for case in section.cases_at(tp):
        mine = [v for v in case.violations if v["invariant_id"] == invariant_id]
        if mine:
            found.append(FailingCase(case.case_id, case.status, _merged(mine, level), case.reproduce, case.case_yaml))
    return found


def _merged(violations: list[dict], level: str) -> tuple[Message, ...]:
    """Ranks that report the same message are merged into one line."""
    merged: dict[tuple, list] = {}
    for v in violations:
        key = (str(v.get("level", level)), str(v.get("message", "")), v.get("request"), v.get("field"))
        merged.setdefault(key, []).append(v.get("rank"))
    return tuple(
        Message(lvl, text, _where(ranks, request, field_name))
        for (lvl, text, request, field_name), ranks in merged.items()
    )


def _where(ranks: list, request, field_name) -> str:
    known = sorted({r for r in ranks if r is not None})
    parts = [("rank " if len(known) == 1 else "ranks ") + ", ".join(map(str, known))] if known else []
    parts += [f"{name} {value}" for name, value in (("request", request), ("field", field_name)) if value is not None]
    return ", ".join(parts)


def _error_messages(case: CaseRecord) -> tuple[Message, ...]:
    messages = []
    for error in case.errors:
        text = str(error.get("message", ""))
        who = "the judge" if error.get("rank") is None else f"rank {error.get('rank')}"
        tail = "\n".join(str(error.get("traceback") or "").rstrip().splitlines()[-12:])
        messages.append(Message("MUST", f"{text}\n{tail}" if tail else text, f"{who} [{error.get('kind', 'error')}]"))
    return tuple(messages)


# -- diff ----------------------------------------------------------------------

NEWLY_FAILING, NEWLY_PASSING, NEWLY_JUDGED, NO_LONGER_JUDGED = (
    "newly failing",
    "newly passing",
    "newly judged",
    "no longer judged",
)
CHANGE_KINDS = (NEWLY_FAILING, NEWLY_PASSING, NEWLY_JUDGED, NO_LONGER_JUDGED)


@dataclass(frozen=True)
class Change:
    kind: str
    invariant_id: str
    tp: int
    old: str  # verdict, or "absent" where the old run had no such cell
    new: str
    new_failing_cases: tuple[str, ...] = ()  # failing now, not failing before


@dataclass
class SectionDiff:
    implementation: str
    old_report: str
    new_report: str
    changes: list[Change]

    def of_kind(self, kind: str) -> list[Change]:
        return [c for c in self.changes if c.kind == kind]


def diff_sections(old: Section, new: Section, old_name: str, new_name: str) -> SectionDiff:
    if old.implementation != new.implementation:
        raise ValueError(
            f"cannot diff {old.implementation!r} against {new.implementation!r}: "
            "a diff compares two runs of one implementation"
        )
    changes = []
    rows = list(dict.fromkeys([*old.table, *new.table]))
    for invariant_id in rows:
        for tp in sorted(set(old.tp_sizes) | set(new.tp_sizes)):
            before, after = _verdict_at(old, invariant_id, tp), _verdict_at(new, invariant_id, tp)
            kind = _change_kind(before, after)
            if kind:
                newly = _failing_ids(new, invariant_id, tp) - _failing_ids(old, invariant_id, tp)
                changes.append(Change(kind, invariant_id, tp, before, after, tuple(sorted(newly))))
    return SectionDiff(new.implementation, old_name, new_name, changes)


def _verdict_at(section: Section, invariant_id: str, tp: int) -> str:
    if tp in section.not_applicable:
        return NA
    cell = section.table.get(invariant_id, {}).get(tp)
    return "absent" if cell is None else cell.verdict


def _change_kind(before: str, after: str) -> str | None:
    if before not in JUDGED:
        return NEWLY_JUDGED if after in JUDGED else None
    if after not in JUDGED:
        return NO_LONGER_JUDGED
    if before == PASS and after in FAILING:
        return NEWLY_FAILING
    if before in FAILING and after == PASS:
        return NEWLY_PASSING
    return None  # unchanged, or a change between fail, warn and xfail


def _failing_ids(section: Section, invariant_id: str, tp: int) -> set[str]:
    return {c.case_id for c in failing_cases(section, invariant_id, tp, "MUST")}


def diff_runs(reports: list[Report]) -> list[SectionDiff]:
    """Each implementation's consecutive runs, in the order the reports were given (older first)."""
    diffs = []
    labels = dict.fromkeys(s.implementation for r in reports for s in r.sections)
    for label in labels:
        runs = [(r.name, r.section(label)) for r in reports if r.section(label) is not None]
        for (old_name, old), (new_name, new) in zip(runs, runs[1:], strict=False):
            diffs.append(diff_sections(old, new, old_name, new_name))
    return diffs
