"""``python -m shardspec.conformance report releases A.json B.json ... -o releases.html``: releases x invariants.

One page, like test262.fyi's engines x tests: a column per implementation of each run given (a vLLM
release run through examples/vllm is headed with its factory's ``RELEASE``, e.g. "vLLM 0.34.0", with the
run's profile and shardspec's version, and how many rows each state has), a row per invariant of any run's
table (in the runs' order, then the run-errors and not-run rows), and in each cell, in a word or two, what
that release does over every group size its run had:

- ``pass``: held in every case that judged it;
- ``n known``: n failing cases, each one expected by the run's known failures (``--xfails-file``); the
  cell's keys (``D1``, ``S2``) name their reasons, which the legend under the table prints once: ``D`` a
  defect of the release (``why: vllm-defect``, any ``*-defect``), ``S`` a choice of the spec the release
  never promised (``why: spec-choice``), ``K`` an entry that gives no why; defects and choices differ in
  colour too;
- ``n untriaged``: n failing cases no known failure explains (a MUST or a SHOULD invariant);
- ``not run``: no case judged it (the run's cells are n/a or not-run, or its profile has no such row).

Hovering a cell shows its verdict per group size and its reasons in full. Reads the JSON reports only (no
torch, no spec files): a page can be built from runs of other machines.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from dataclasses import dataclass, field

from shardspec.conformance.report.model import (
    FAIL,
    NA,
    NOT_RUN,
    PASS,
    SPEC_CHOICE,
    WARN,
    XFAIL,
    Report,
    ReportError,
    Section,
    known_why,
    load_report,
    report_names,
)
from shardspec.conformance.report.pages import environment, write_page

PASSED, KNOWN, UNTRIAGED, NOT_JUDGED = "pass", "known", "untriaged", "not run"
STATES = (PASSED, KNOWN, UNTRIAGED, NOT_JUDGED)
DEFECT = "defect"  # the kind of a known reason whose why is vllm-defect or any *-defect
KEY_LETTERS = {DEFECT: "D", SPEC_CHOICE: "S", "": "K"}  # a known reason's kind -> its key's letter
SHOWN_KEYS = 3  # keys a cell shows; "+n" for the rest (its title lists them all)
LEGEND = [  # (state, kind, what the cell reads, what it means)
    (PASSED, "", PASSED, "held in every case that judged it, at every group size of the run"),
    (KNOWN, DEFECT, "n known D1", "n failing cases, all expected; one reason at least is a defect of the release"),
    (KNOWN, SPEC_CHOICE, "n known S1", "n failing cases, all expected: the spec asks what the release never promised"),
    (KNOWN, "", "n known K1", "n failing cases, all expected by entries that say no why"),
    (UNTRIAGED, "", "n untriaged", "n failing cases that no known failure explains"),
    (NOT_JUDGED, "", NOT_JUDGED, "no case judged it in that run (n/a, not-run, or not in the run's profile)"),
]


def reason_kind(reason: str) -> str:
    """DEFECT, SPEC_CHOICE, or "" (no why) for a known failure's reason as the JSON report writes it."""
    why = known_why(reason)
    return DEFECT if why.endswith("defect") else why


@dataclass(frozen=True)
class ReleaseColumn:
    title: str  # the release ("vLLM 0.34.0"), else the implementation's name
    implementation: str
    profile: str
    shardspec: str
    report: str
    tp_sizes: tuple[int, ...]


@dataclass(frozen=True)
class ReleaseCell:
    state: str  # one of STATES
    count: int | None = None  # failing cases (known and untriaged cells), where the report says
    reasons: tuple[str, ...] = ()  # the known failures' reasons, as the report writes them (known cells)
    detail: str = ""  # the run's own cells, per tp

    @property
    def text(self) -> str:
        """What the cell reads: "3 known", "1 untriaged", "pass", "not run"."""
        return f"{self.count} {self.state}" if self.count else self.state

    @property
    def kind(self) -> str:
        """A known cell's colour: DEFECT if one of its reasons is a defect, SPEC_CHOICE if all are choices."""
        kinds = {reason_kind(r) for r in self.reasons}
        return DEFECT if DEFECT in kinds else SPEC_CHOICE if kinds == {SPEC_CHOICE} else ""


@dataclass(frozen=True)
class KnownReason:
    key: str  # what a cell shows: D1, S2, K1
    kind: str  # DEFECT, SPEC_CHOICE or ""
    why: str  # as the xfails file says (vllm-defect), or ""
    text: str  # the reason, without its why
    cells: int  # how many cells cite it


@dataclass
class ReleasesPage:
    columns: list[ReleaseColumn]
    rows: list[tuple[str, list[ReleaseCell]]]  # (invariant id, a cell per column)
    reasons: dict[str, KnownReason] = field(default_factory=dict)  # as the report writes it -> its key

    def cell(self, invariant_id: str, title: str) -> ReleaseCell:
        """The cell of ``invariant_id`` under the column headed ``title`` (tests read the page through it)."""
        index = [c.title for c in self.columns].index(title)
        return next(cells[index] for inv, cells in self.rows if inv == invariant_id)

    def keys(self, cell: ReleaseCell) -> list[str]:
        keys = [self.reasons[r].key for r in cell.reasons]
        return keys if len(keys) <= SHOWN_KEYS else [*keys[:SHOWN_KEYS], f"+{len(keys) - SHOWN_KEYS}"]

    def hover(self, cell: ReleaseCell) -> str:
        """The cell's title: its verdict per group size, then each reason in full."""
        reasons = (self.reasons[r] for r in cell.reasons)
        return "\n".join([cell.detail, *(f"{r.key} {r.why or 'known'}: {r.text}" for r in reasons)])

    def tally(self, index: int) -> list[tuple[str, int]]:
        """How many rows of column ``index`` read each state (known ones by their colour), zeros left out."""
        labels = [_tally_label(cells[index]) for _, cells in self.rows]
        order = [PASSED, f"{KNOWN} D", f"{KNOWN} S", KNOWN, UNTRIAGED, NOT_JUDGED]
        return [(label, labels.count(label)) for label in order if label in labels]


def _tally_label(cell: ReleaseCell) -> str:
    return f"{KNOWN} {KEY_LETTERS[cell.kind]}" if cell.state == KNOWN and cell.kind else cell.state


def build_releases(reports: list[Report]) -> ReleasesPage:
    columns, sections = [], []
    for report in reports:
        releases = report.metadata.get("releases") or {}
        for section in report.sections:
            title = str(releases.get(section.implementation) or section.implementation)
            columns.append(
                ReleaseColumn(
                    title=title,
                    implementation=section.implementation,
                    profile=str(report.metadata.get("profile", "?")),
                    shardspec=str(report.metadata.get("shardspec", "?")),
                    report=report.name,
                    tp_sizes=tuple(section.tp_sizes),
                )
            )
            sections.append(section)
    invariants = list(dict.fromkeys(inv for section in sections for inv in section.table))
    rows = [(inv, [_cell(section, inv) for section in sections]) for inv in invariants]
    return ReleasesPage(columns, rows, _reason_keys(rows))


def _reason_keys(rows: list[tuple[str, list[ReleaseCell]]]) -> dict[str, KnownReason]:
    """A key per distinct reason, numbered per kind in the order the page first cites them; defects first."""
    cited = [reason for _, cells in rows for cell in cells for reason in cell.reasons]
    keys: dict[str, KnownReason] = {}
    for reason in dict.fromkeys(cited):
        kind, why = reason_kind(reason), known_why(reason)
        number = 1 + sum(known.kind == kind for known in keys.values())
        text = reason[len(why) + 2 :] if why else reason
        keys[reason] = KnownReason(f"{KEY_LETTERS[kind]}{number}", kind, why, text, cited.count(reason))
    order = list(KEY_LETTERS)  # the legend lists defects first, then choices, then the rest
    return dict(sorted(keys.items(), key=lambda item: (order.index(item[1].kind), int(item[1].key[1:]))))


def _cell(section: Section, invariant_id: str) -> ReleaseCell:
    cells = section.table.get(invariant_id)
    if not cells:
        return ReleaseCell(NOT_JUDGED, detail="not in this run's profile")
    detail = ", ".join(f"tp {tp}: {cell.text}" for tp, cell in sorted(cells.items()))
    verdicts = {cell.verdict for cell in cells.values()}
    if verdicts & {FAIL, WARN} or not verdicts <= {PASS, XFAIL, NA, NOT_RUN}:
        counted = section.untriaged.get(invariant_id, {})
        failing = [counted.get(tp, _failing(section, invariant_id, tp)) for tp in _sizes(cells, FAIL, WARN)]
        return ReleaseCell(UNTRIAGED, sum(failing), detail=detail)
    if XFAIL in verdicts:
        known = section.known.get(invariant_id, {})
        reasons = tuple(dict.fromkeys(r for tp in sorted(known) for r in known[tp]))
        return ReleaseCell(
            KNOWN, sum(_failing(section, invariant_id, tp) for tp in _sizes(cells, XFAIL)), reasons, detail
        )
    if PASS in verdicts:
        return ReleaseCell(PASSED, detail=detail)
    return ReleaseCell(NOT_JUDGED, detail=detail)


def _sizes(cells: dict, *verdicts: str) -> list[int]:
    return [tp for tp, cell in sorted(cells.items()) if cell.verdict in verdicts]


def _failing(section: Section, invariant_id: str, tp: int) -> int:
    """Failing cases of a row at ``tp``: the count its cell writes (the run-errors and not-run rows), else
    the cases that violate it."""
    written = section.table[invariant_id][tp].count
    if written is not None:
        return written
    return sum(any(v["invariant_id"] == invariant_id for v in c.violations) for c in section.cases_at(tp))


def write_releases(report_paths: list[str], out_path: pathlib.Path, title: str) -> pathlib.Path:
    """Write the page to ``out_path`` (a file); returns its path."""
    names = report_names([str(p) for p in report_paths])
    page = build_releases([load_report(path, name) for path, name in zip(report_paths, names, strict=True)])
    out_path = pathlib.Path(out_path)
    if out_path.is_dir():
        raise ReportError(f"{out_path}: is a folder; the page of releases is one file (-o releases.html)")
    env = environment()
    html = env.get_template("releases.html.j2").render(
        title=title,
        page=out_path.name,
        pages={out_path.name: "releases"},
        releases=page,
        legend=LEGEND,
    )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_page(out_path, html)
    return out_path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shardspec.conformance report releases",
        description="One HTML page of releases x invariants from the JSON reports of several runs "
        "(one run per release, e.g. nox -s vllm -- 0.33.0 and nox -s vllm).",
    )
    parser.add_argument("reports", nargs="+", metavar="REPORT.json", help="JSON reports (--json of a run)")
    parser.add_argument("-o", "--output", required=True, type=pathlib.Path, metavar="FILE", help="the page")
    parser.add_argument("--title", default="shardspec: releases x invariants", help="the page's title")
    args = parser.parse_args(argv)
    try:
        path = write_releases(args.reports, args.output, args.title)
    except ReportError as exc:
        print(f"shardspec report releases: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"shardspec report releases: error: cannot write {args.output}: {exc}", file=sys.stderr)
        return 2
    print(f"releases page: {path.resolve().as_uri()}")
    return 0
