"""``python -m shardspec.conformance report releases A.json B.json ... -o releases.html``: releases x invariants.

One page, like test262.fyi's engines x tests: a column per implementation of each run given (a vLLM
release run through examples/vllm is headed with its factory's ``RELEASE``, e.g. "vLLM 0.34.0", with the
run's profile and shardspec's version), a row per invariant of any run's table (in the runs' order, then
the run-errors and not-run rows), and in each cell what that release does over every group size its run
had:

- ``pass``: held in every case that judged it;
- ``known``: violated only where the run's known failures (``--xfails-file``) expect it; the cell shows
  their reasons;
- ``untriaged``: violated where no known failure explains it (a MUST or a SHOULD invariant);
- ``not run``: no case judged it (the run's cells are n/a or not-run, or its profile has no such row).

Reads the JSON reports only (no torch, no spec files): a page can be built from runs of other machines.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

from shardspec.conformance.report.model import FAIL, NA, NOT_RUN, PASS, WARN, XFAIL, Report, Section

PASSED, KNOWN, UNTRIAGED, NOT_JUDGED = "pass", "known", "untriaged", "not run"
STATES = (PASSED, KNOWN, UNTRIAGED, NOT_JUDGED)
LEGEND = [
    (PASSED, "held in every case that judged it, at every group size of the run"),
    (KNOWN, "violated only where the release's known failures expect it (hover or read the reason)"),
    (UNTRIAGED, "violated where no known failure explains it"),
    (NOT_JUDGED, "no case judged it in that run (n/a, not-run, or not in the run's profile)"),
]


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
    text: str  # what the cell reads
    reasons: tuple[str, ...] = ()  # the known failures' reasons (known cells)
    detail: str = ""  # the run's own cells, per tp


@dataclass
class ReleasesPage:
    columns: list[ReleaseColumn]
    rows: list[tuple[str, list[ReleaseCell]]]  # (invariant id, a cell per column)

    def cell(self, invariant_id: str, title: str) -> ReleaseCell:
        """The cell of ``invariant_id`` under the column headed ``title`` (tests read the page through it)."""
        index = [c.title for c in self.columns].index(title)
        return next(cells[index] for inv, cells in self.rows if inv == invariant_id)


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
    return ReleasesPage(columns, rows)


def _cell(section: Section, invariant_id: str) -> ReleaseCell:
    cells = section.table.get(invariant_id)
    if not cells:
        return ReleaseCell(NOT_JUDGED, NOT_JUDGED, detail="not in this run's profile")
    detail = ", ".join(f"tp {tp}: {cell.text}" for tp, cell in sorted(cells.items()))
    verdicts = {cell.verdict for cell in cells.values()}
    if verdicts & {FAIL, WARN} or not verdicts <= {PASS, XFAIL, NA, NOT_RUN}:
        return ReleaseCell(UNTRIAGED, UNTRIAGED, detail=detail)
    if XFAIL in verdicts:
        known = section.known.get(invariant_id, {})
        reasons = tuple(dict.fromkeys(r for tp in sorted(known) for r in known[tp]))
        return ReleaseCell(KNOWN, KNOWN, reasons, detail)
    if PASS in verdicts:
        return ReleaseCell(PASSED, PASSED, detail=detail)
    return ReleaseCell(NOT_JUDGED, NOT_JUDGED, detail=detail)


def write_releases(report_paths: list[str], out_path: pathlib.Path, title: str) -> pathlib.Path:
    """Write the page to ``out_path`` (a file); returns its path."""
    import jinja2

    from shardspec.conformance.report.html import TEMPLATES, _write_page
    from shardspec.conformance.report.model import ReportError, load_report, report_names

    names = report_names([str(p) for p in report_paths])
    page = build_releases([load_report(path, name) for path, name in zip(report_paths, names, strict=True)])
    out_path = pathlib.Path(out_path)
    if out_path.is_dir():
        raise ReportError(f"{out_path}: is a folder; the page of releases is one file (-o releases.html)")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
    )
    html = env.get_template("releases.html.j2").render(
        title=title, page=out_path.name, pages={out_path.name: "releases"}, releases=page, legend=LEGEND
    )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    _write_page(out_path, html)
    return out_path


def main(argv: list[str]) -> int:
    import argparse
    import sys

    from shardspec.conformance.report.model import ReportError

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
