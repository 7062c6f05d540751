"""Reports: the per-invariant table, the failure list, the JSON report, xfails.

A cell of the table is the result of one invariant over every case run at
one group size: ``pass``, ``FAIL`` (a MUST invariant was violated), ``warn``
(a SHOULD invariant was violated), ``xfail`` (violated and listed in the
xfails file), ``not-run`` (no case ran there, or no checker exists) or
``n/a`` (the entry does not apply at that size: a mixed ``A/B`` group at tp 1).
Cases whose run failed (a rank raised, hung or died) are listed on the
``(run errors)`` row: they fail the run like a MUST violation. A cell where
cases ran but none could judge the invariant (e.g. INV-REJECT-* without an
invalid-input case at that size) is ``n/a`` too: it is never a ``pass``.
"""

from __future__ import annotations

import platform
import textwrap
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import numpy
import torch

import shardspec
from shardspec.conformance.output_paths import REPORT_MARKER
from shardspec.conformance.record import ERROR, NOT_RUN, CaseResult
from shardspec.conformance.report.xfails import Xfails
from shardspec.spec.loader import default_profile, load_spec, spec_version

ERRORS_ROW = "(run errors)"
NOT_RUN_ROW = "(cases not run)"


@dataclass(frozen=True)
class InvariantInfo:
    id: str
    level: str  # MUST | SHOULD
    step: str = ""
    statement: str = ""


def load_invariants(profile: str | None = None) -> list[InvariantInfo]:
    """The invariants of ``profile`` (default: the default profile), as the report lists them."""
    spec = load_spec()
    return [
        InvariantInfo(inv.id, inv.level, inv.step, " ".join(inv.statement.split()))
        for inv in load_spec(profile=profile or default_profile(spec)).invariants
        if not inv.retired
    ]


# -- xfails ------------------------------------------------------------------


# -- the table ---------------------------------------------------------------


@dataclass
class Section:
    """The results of one implementation choice."""

    label: str
    results: list[CaseResult]
    tp_sizes: list[int]
    not_applicable: dict[int, str] = field(default_factory=dict)  # tp -> why the entry does not apply
    # tp -> the input space its cases drew (report/input_coverage.py); empty where not computed.
    input_coverage: dict[int, dict] = field(default_factory=dict)


NOT_APPLICABLE = "n/a"


def cell(section: Section, invariant: InvariantInfo, tp: int, checked: set[str], xfails: Xfails) -> str:
    if tp in section.not_applicable:
        return NOT_APPLICABLE
    ran = [r for r in section.results if r.tp == tp and r.status != NOT_RUN]
    if not ran or invariant.id not in checked:
        return "not-run"
    failing = [r for r in ran if any(v["invariant_id"] == invariant.id for v in r.violations)]
    if not failing:
        return "pass" if judged_count(section, invariant.id, tp) else NOT_APPLICABLE
    if all(xfails.covers(invariant.id, r) for r in failing):
        return "xfail"
    return "FAIL" if invariant.level == "MUST" else "warn"


def judged_count(section: Section, invariant_id: str, tp: int) -> int:
    """How many cases at ``tp`` judged the invariant."""
    return sum(invariant_id in r.judged for r in section.results if r.tp == tp)


def table_rows(section: Section, invariants: list[InvariantInfo], checked: set[str], xfails: Xfails) -> list[list[str]]:
    rows = [
        [inv.id, inv.level] + [cell(section, inv, tp, checked, xfails) for tp in section.tp_sizes] for inv in invariants
    ]
    rows.append([ERRORS_ROW, "MUST"] + [_count_cell(section, tp, ERROR, xfails) for tp in section.tp_sizes])
    rows.append([NOT_RUN_ROW, "MUST"] + [_count_cell(section, tp, NOT_RUN, xfails) for tp in section.tp_sizes])
    return rows


def _count_cell(section: Section, tp: int, status: str, xfails: Xfails) -> str:
    if tp in section.not_applicable:
        return NOT_APPLICABLE
    hits = [r for r in section.results if r.tp == tp and r.status == status]
    if not hits:
        return "pass" if status == ERROR else "0"
    if all(xfails.covers("", r) for r in hits):
        return f"xfail {len(hits)}"
    return f"FAIL {len(hits)}"


def known_reasons(section: Section, rows: list[list[str]], xfails: Xfails) -> dict[str, dict[str, list[str]]]:
    """For each xfail cell of ``rows`` (invariant -> tp -> the reasons of the known failures it covers):
    what a reader of the JSON needs to tell a known failure from a new one."""
    out: dict[str, dict[str, list[str]]] = {}
    for row in rows:
        for tp, cell_text in zip(section.tp_sizes, row[2:], strict=False):
            if str(cell_text).startswith("xfail"):
                invariant, failing = _failing(section, row[0], tp)
                reasons = {xfails.reason_of(invariant, r) for r in failing}
                out.setdefault(row[0], {})[str(tp)] = sorted(r for r in reasons if r)
    return out


def untriaged_counts(section: Section, rows: list[list[str]], xfails: Xfails) -> dict[str, dict[str, int]]:
    """For each FAIL or warn cell of ``rows`` (invariant -> tp -> n): how many of its failing cases no known
    failure covers (the page of releases counts them; the cell alone cannot tell one from all)."""
    out: dict[str, dict[str, int]] = {}
    for row in rows:
        for tp, cell_text in zip(section.tp_sizes, row[2:], strict=False):
            if str(cell_text).split()[:1] in (["FAIL"], ["warn"]):
                invariant, failing = _failing(section, row[0], tp)
                out.setdefault(row[0], {})[str(tp)] = sum(xfails.reason_of(invariant, r) is None for r in failing)
    return out


def _failing(section: Section, row_id: str, tp: int) -> tuple[str, list[CaseResult]]:
    """The invariant of a row ("" for the run-errors and not-run rows) and its failing cases at ``tp``."""
    if row_id not in (ERRORS_ROW, NOT_RUN_ROW):
        return row_id, [r for r in section.results if r.tp == tp and row_id in _violated(r)]
    status = NOT_RUN if row_id == NOT_RUN_ROW else ERROR
    return "", [r for r in section.results if r.tp == tp and r.status == status]


def _violated(result) -> set[str]:
    return {v["invariant_id"] for v in result.violations}


def render_table(section: Section, rows: list[list[str]]) -> str:
    header = ["invariant", "level"] + [f"tp={tp}" for tp in section.tp_sizes]
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    line = lambda row: "  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=False)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def failing_invariants(rows: list[list[str]]) -> list[str]:
    return sorted({row[0] for row in rows if any(str(c).startswith("FAIL") for c in row[2:])})


# -- failures ----------------------------------------------------------------


def describe_failures(
    section: Section, levels: dict[str, str], xfails: Xfails, cases_per_invariant: int = 3
) -> list[str]:
    """One entry per violation (ranks that agree are merged), a few cases per invariant."""
    lines, shown = [], {}
    for result in section.results:
        if result.status == NOT_RUN:
            continue
        for (invariant_id, request, field_name, message), ranks in _merged(result.violations).items():
            if xfails.covers(invariant_id, result):
                continue
            cases = shown.setdefault(invariant_id, set())
            if result.case_id not in cases and len(cases) >= cases_per_invariant:
                continue
            cases.add(result.case_id)
            level = "FAIL" if levels.get(invariant_id, "MUST") == "MUST" else "warn"
            where = [_ranks(ranks)] + [
                f"{k} {v}" for k, v in (("request", request), ("field", field_name)) if v is not None
            ]
            lines.append(
                f"{level} [{invariant_id}] case {result.case_id} (tp {result.tp}): "
                f"{', '.join(w for w in where if w)}\n"
                f"{textwrap.indent(message.rstrip(), '    ')}\n    reproduce: {result.reproduce}"
                + (f"\n    {result.shrunk}" if result.shrunk else "")
            )
        if result.status == ERROR and not xfails.covers("", result):
            lines.append(_describe_errors(result))
    lines += _omitted(section, shown, xfails)
    return lines


def _merged(violations: list[dict[str, Any]]) -> dict[tuple, list]:
    merged: dict[tuple, list] = {}
    for v in violations:
        key = (v["invariant_id"], v.get("request"), v.get("field"), v["message"])
        merged.setdefault(key, []).append(v.get("rank"))
    return merged


def _ranks(ranks: list) -> str:
    known = sorted(r for r in set(ranks) if r is not None)
    if not known:
        return ""
    return f"rank {known[0]}" if len(known) == 1 else f"ranks {', '.join(map(str, known))}"


def _omitted(section: Section, shown: dict[str, set], xfails: Xfails) -> list[str]:
    lines = []
    for invariant_id, cases in shown.items():
        failing = {
            r.case_id
            for r in section.results
            if any(v["invariant_id"] == invariant_id for v in r.violations) and not xfails.covers(invariant_id, r)
        }
        if len(failing) > len(cases):
            lines.append(
                f"... [{invariant_id}] fails in {len(failing) - len(cases)} more case(s) "
                "(all of them in the JSON report)"
            )
    return lines


def _describe_errors(result: CaseResult) -> str:
    parts = [f"ERROR case {result.case_id} (tp {result.tp})"]
    for error in result.errors:
        who = "the judge" if error["rank"] is None else f"rank {error['rank']}"
        parts.append(f"  {who} [{error['kind']}]: {error['message']}")
        if error.get("traceback") and error["kind"] in ("raised", "harness"):
            tail = "\n".join(error["traceback"].rstrip().splitlines()[-12:])
            parts.append(textwrap.indent(tail, "      "))
    parts.append(f"  reproduce: {result.reproduce}")
    if result.shrunk:
        parts.append(f"  {result.shrunk}")
    return "\n".join(parts)


# -- launches that did not run -----------------------------------------------


def describe_launch_failures(failures: list[dict[str, Any]]) -> list[str]:
    """Each launch whose group never started: why, the first lines of its ranks' error and the full log."""
    if not failures:
        return []
    lines = ["", "launches that did not run (their cases are not run):"]
    for failure in failures:
        lines.append(f"  tp {failure['tp']}, launch {failure['launch']}: {failure['reason']}")
        if failure.get("error"):
            lines.append("    the ranks' error (first lines):")
            lines += [textwrap.indent(failure["error"], "      ")]
        lines.append(f"    full log: {failure['log']}")
    return lines


# -- JSON --------------------------------------------------------------------


def run_metadata(
    labels: list[str], tp_sizes: list[int], seed: int, wall_s: float, backend: str, device: str, extra: dict[str, Any]
) -> dict[str, Any]:
    try:
        import triton  # the impl extra: a run of the reference needs none

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "implementations": labels,
        "spec_version": spec_version(),
        "shardspec": package_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "backend": backend,
        "device": device,
        "tp_sizes": tp_sizes,
        "seed": seed,
        "wall_s": round(wall_s, 2),
        **extra,
    }


def package_version() -> str:
    """The installed distribution's version; a clone's folder that shadows the package has none."""
    try:
        return metadata.version("shardspec")
    except metadata.PackageNotFoundError:
        return getattr(shardspec, "__version__", "unknown")


def _case_json(result: CaseResult, levels: dict[str, str]) -> dict[str, Any]:
    """A case with the level of each violation; a case failing only SHOULD invariants is a "warn"."""
    data = result.to_json()
    data["violations"] = [{**v, "level": levels.get(v["invariant_id"], "MUST")} for v in data["violations"]]
    if data["status"] == "fail" and all(v["level"] == "SHOULD" for v in data["violations"]):
        data["status"] = "warn"
    return data


def json_report(
    metadata: dict[str, Any],
    sections: list[Section],
    tables: list[list[list[str]]],
    warnings: list[str],
    exit_code: int,
    invariants: list[InvariantInfo] | None = None,
    launch_failures: list[dict[str, Any]] | None = None,
    xfails: Xfails | None = None,
) -> dict[str, Any]:
    """The JSON report; with ``xfails``, each row says why its xfail cells are expected (``known``) and how
    many failing cases of its FAIL or warn cells no known failure covers (``untriaged``)."""
    levels = {inv.id: inv.level for inv in invariants or []}
    xfails = xfails or Xfails()
    known = [known_reasons(section, rows, xfails) for section, rows in zip(sections, tables, strict=False)]
    untriaged = [untriaged_counts(section, rows, xfails) for section, rows in zip(sections, tables, strict=False)]
    return {
        "report": REPORT_MARKER,  # first: how a later run knows the file it may replace (output_paths.py)
        "metadata": metadata,
        "exit_code": exit_code,
        "warnings": warnings,
        # Each launch whose group never started: tp, launch, reason, log (its path), error (its first lines).
        "launch_failures": list(launch_failures or []),
        "sections": [
            {
                "implementation": section.label,
                "tp_sizes": section.tp_sizes,
                "not_applicable": {str(tp): why for tp, why in section.not_applicable.items()},
                "table": [
                    {
                        "invariant": row[0],
                        "level": row[1],
                        "results": {str(tp): c for tp, c in zip(section.tp_sizes, row[2:], strict=False)},
                        "judged": {str(tp): judged_count(section, row[0], tp) for tp in section.tp_sizes},
                        **({"known": reasons[row[0]]} if row[0] in reasons else {}),
                        **({"untriaged": counts[row[0]]} if row[0] in counts else {}),
                    }
                    for row in rows
                ],
                "cases": [_case_json(r, levels) for r in section.results],
                "input_coverage": {str(tp): drawn for tp, drawn in section.input_coverage.items()},
            }
            for section, rows, reasons, counts in zip(sections, tables, known, untriaged, strict=False)
        ],
    }
