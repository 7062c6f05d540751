"""``python -m shardspec.conformance report R1.json [R2.json ...] -o DIR``: a static HTML report
(``report releases R1.json R2.json -o releases.html``: one page of releases x invariants, report/releases.py).

Writes one folder that opens from disk (no server, nothing fetched from the
network; styles and scripts are inline):

- ``index.html``: the compliance matrix (invariants x implementation x tp) of
  every report given; a failing cell opens the failing cases, their
  messages, the minimal case where the report has one, and the command that
  reproduces it;
- ``diff.html``: per implementation found in several reports, what changed
  from one run to the next (reports in the order given, older first);
- ``bench.html`` with ``--bench``: benchmark tables and plots (copied in).

Exit code 0, or 2 with one line on standard error when an input is unusable.
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import sys
from typing import Any

from shardspec.conformance.report.bench import load_bench
from shardspec.conformance.report.matrix import CHANGE_KINDS, Matrix, build_matrix, diff_runs, report_profile
from shardspec.conformance.report.model import ReportError, load_report, report_names
from shardspec.conformance.report.pages import environment, write_page
from shardspec.conformance.report.releases import main as releases_main
from shardspec.spec.loader import load_spec

RUN_FIELDS = (
    "implementations",
    "spec_version",
    "profile",
    "shardspec",
    "torch",
    "triton",
    "backend",
    "device",
    "mode",
    "tp_sizes",
    "seed",
    "max_examples",
    "wall_s",
    "notes",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m shardspec.conformance report",
        description="Build a static HTML report from conformance JSON reports.",
    )
    parser.add_argument(
        "reports",
        nargs="+",
        metavar="REPORT.json",
        help="JSON reports (--json of a run); for the diff, older runs first",
    )
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        type=pathlib.Path,
        metavar="DIR",
        help="folder to write (created; its index.html, diff.html, bench.html are replaced)",
    )
    parser.add_argument(
        "--bench",
        action="append",
        default=[],
        metavar="PATH",
        help="benchmark results: .json, .png or .txt files, or folders of them (e.g. bench/results)",
    )
    parser.add_argument("--title", default="shardspec conformance", help="the pages' title")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["releases"]:  # one page of releases x invariants (report/releases.py)
        return releases_main(argv[1:])
    args = build_parser().parse_intermixed_args(argv)  # reports may come after --bench PATH
    try:
        pages = build_site(args.reports, args.output, bench=args.bench, title=args.title)
    except ReportError as exc:
        print(f"shardspec report: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if exc.name != "jinja2":
            raise
        print(
            "shardspec report: error: jinja2 is missing; install it with pip install 'shardspec[report]'",
            file=sys.stderr,
        )
        return 2
    except OSError as exc:
        print(f"shardspec report: error: cannot write {args.output}: {exc}", file=sys.stderr)
        return 2
    print(f"HTML report: {pages[0].resolve().as_uri()}")
    return 0


def build_site(
    report_paths: list[str], out_dir: pathlib.Path, bench: list[str] | None = None, title: str = "shardspec conformance"
) -> list[pathlib.Path]:
    """Write the pages; returns their paths (index.html first)."""
    names = report_names([str(p) for p in report_paths])
    reports = [load_report(path, name) for path, name in zip(report_paths, names, strict=True)]
    matrix = build_matrix(reports, load_spec(profile=report_profile(reports)))
    out_dir = pathlib.Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ReportError(f"{out_dir}: exists and is not a folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    bench_files = load_bench(bench or [], out_dir)
    pages = {"index.html": "matrix"}
    if len(reports) > 1:
        pages["diff.html"] = "diff"
    if bench_files:
        pages["bench.html"] = "benchmarks"
    env = environment(trim_blocks=True, lstrip_blocks=True)
    common = {"title": title, "pages": pages, "reports": [_run_summary(r) for r in reports]}
    contexts = {
        "index.html": {"matrix": matrix, "header": header_rows(matrix), "legend": LEGEND},
        "diff.html": {"diffs": diff_runs(reports), "kinds": CHANGE_KINDS},
        "bench.html": {"bench_files": bench_files},
    }
    written = []
    for page in pages:
        html = env.get_template(page + ".j2").render(page=page, **common, **contexts[page])
        path = out_dir / page
        write_page(path, html)
        written.append(path)
    return written


LEGEND = [
    ("fail", "a MUST invariant was violated"),
    ("warn", "a SHOULD invariant was violated"),
    ("xfail", "violated, and listed as an expected failure"),
    ("pass", "held in every case judged"),
    ("n/a", "does not apply, or no case at this size could judge it"),
    ("not-run", "no case ran there, or no checker exists"),
    ("unknown", "a verdict this version does not know"),
]


def header_rows(matrix: Matrix) -> list[list[tuple[str, int]]]:
    """The column headers, as (label, colspan) runs: report (when several), implementation, tp."""
    columns = matrix.columns
    levels = [
        lambda c: (c.report,),
        lambda c: (c.report, c.implementation),
        lambda c: (c.report, c.implementation, c.tp),
    ]
    show = levels if len({c.report for c in columns}) > 1 else levels[1:]
    rows = []
    for key in show:
        runs = [(k[-1], len(list(group))) for k, group in itertools.groupby(columns, key=key)]
        rows.append([(f"tp {label}" if key is levels[2] else str(label), span) for label, span in runs])
    return rows


def _run_summary(report) -> dict[str, Any]:
    metadata = report.metadata
    fields = [(key, metadata[key]) for key in RUN_FIELDS if key in metadata]
    fields = [(k, ", ".join(map(str, v)) if isinstance(v, list) else v) for k, v in fields]
    return {
        "name": report.name,
        "path": report.path,
        "fields": fields,
        "warnings": report.warnings,
        "exit_code": report.exit_code,
        "launch_failures": report.launch_failures,
    }
