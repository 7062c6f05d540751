"""What a run's PASS rests on: the variations of the spec's input space (cases/input_space.py) that the
cases which ran drew, per entry and group size, and those none drew.

Computed from the cases of the results that were run (a case not run draws nothing), so an entry that
runs fewer cases (a mixed entry) or a run cut short shows less. Reported on the terminal (one line per
entry, then what no size drew; after every entry, once, the pairs the space leaves out on purpose and why), in the JSON
(``sections[].input_coverage``) and in the HTML matrix (the pairs left out: a note above it).
"""

from __future__ import annotations

from collections.abc import Iterable

from shardspec.conformance.cases.coverage import coverage
from shardspec.conformance.record import NOT_RUN, CaseResult
from shardspec.spec.rules import Rules

SHOWN = 8  # variations named on the terminal per line; the JSON lists them all


def input_coverage(results: Iterable[CaseResult], tp_sizes: Iterable[int], rules: Rules) -> dict[int, dict]:
    """Per group size, :meth:`Coverage.as_dict` of the cases in ``results`` that ran at that size."""
    ran = [r for r in results if r.status != NOT_RUN]
    return {tp: coverage([r.case for r in ran if r.tp == tp], rules).as_dict() for tp in tp_sizes}


def summary_lines(label: str, per_tp: dict[int, dict]) -> list[str]:
    """The terminal's lines for one entry: drawn/all per size, then each variation left undrawn with the
    sizes that left it (grouped by those sizes)."""
    if not per_tp:
        return []
    cells = ", ".join(f"tp {tp} {c['covered']}/{c['variations']}" for tp, c in per_tp.items())
    lines = [f"input coverage, {label}: {cells} variations of the input space drawn by the cases that ran"]
    where: dict[str, list[int]] = {}
    for tp, entry in per_tp.items():
        for key in entry["not_covered"]:
            where.setdefault(key, []).append(tp)
    by_sizes: dict[tuple[int, ...], list[str]] = {}
    for key, sizes in where.items():
        by_sizes.setdefault(tuple(sizes), []).append(key)
    for sizes, keys in by_sizes.items():
        shown = ", ".join(keys[:SHOWN]) + (f" and {len(keys) - SHOWN} more (JSON report)" if len(keys) > SHOWN else "")
        lines.append(f"  not drawn at tp {','.join(map(str, sizes))} ({len(keys)}): {shown}")
    return lines


def left_out_lines(per_entry: Iterable[dict[int, dict]]) -> list[str]:
    """The terminal's line naming the pairs the input space leaves out on purpose, and why: once per run,
    after every entry's lines (the run's profile fixes them, so each entry and size lists the same ones)."""
    left_out: dict[str, str] = {}
    for per_tp in per_entry:
        for entry in per_tp.values():
            left_out.update(entry.get("left_out") or {})
    if not left_out:
        return []
    shown = "; ".join(f"{key} ({why})" for key, why in list(left_out.items())[:SHOWN])
    more = f" and {len(left_out) - SHOWN} more (JSON report)" if len(left_out) > SHOWN else ""
    return [f"pairs left out of the space on purpose ({len(left_out)}): {shown}{more}"]
