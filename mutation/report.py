"""Reads mutmut's results in a snapshot, matches survivors with their reasons and writes the report.

A survivor is known by its function and its mutated line(s), not by mutmut's number for it: the
numbers shift whenever the function changes, the mutated text does not. docs/mutation-survivors.md
gives reasons as lines of the form

    - `shardspec.reference.plan.build_plan`: `<mutated line>` — <why this mutant may survive>
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code

# Counted as caught: the tests failed, ran out of time, or the process died.
CAUGHT = {"killed", "timeout", "segfault"}
# mutmut's status of a mutant it has not run (left out of a sample, or the run was stopped).
NOT_RUN = "not checked"
REASON_LINE = re.compile(r"^- `(?P<function>[^`]+)`: `(?P<mutated>.+)` — (?P<reason>\S.*)$")
# mutmut's separator between a class name and its method in mangled names.
CLASS_SEPARATOR = "ǁ"


@dataclass(frozen=True)
class Mutant:
    name: str  # mutmut's, e.g. shardspec.reference.plan.x_build_plan__mutmut_3
    folder: str  # reference or impl
    status: str
    diff: str

    @property
    def function(self) -> str:
        """Dotted name of the mutated function, e.g. shardspec.reference.sharder.ReferenceSharder.plan."""
        module, _, mangled = self.name.partition("__mutmut_")[0].rpartition(".")
        if mangled.startswith("x" + CLASS_SEPARATOR):
            _, cls, method = mangled.split(CLASS_SEPARATOR)
            return f"{module}.{cls}.{method}"
        return f"{module}.{mangled.removeprefix('x_')}"

    @property
    def mutated(self) -> str:
        """The mutated line(s), stripped, joined with ' / '; for a deletion, 'deleted: ' and the line(s)."""
        lines = self.diff.splitlines()
        added = [line[1:].strip() for line in lines if line.startswith("+") and not line.startswith("+++")]
        if added:
            return " / ".join(added)
        removed = [line[1:].strip() for line in lines if line.startswith("-") and not line.startswith("---")]
        return "deleted: " + " / ".join(removed)


@contextmanager
def _cwd(path: Path):
    previous = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def collect_results(snapshot: Path, folders: list[str], with_diffs: bool = True) -> list[Mutant]:
    """Every mutant of the folders, with its status and, unless caught, its diff."""
    mutants = []
    with _cwd(snapshot):
        for folder in folders:
            for meta in sorted(Path("mutants/src/shardspec", folder).rglob("*.py.meta")):
                source = meta.relative_to("mutants").with_suffix("")
                exit_codes = json.loads(meta.read_text())["exit_code_by_key"]
                for name, code in sorted(exit_codes.items()):
                    status = status_by_exit_code[code]
                    judged_survivor = status not in CAUGHT and status != NOT_RUN
                    diff = get_diff_for_mutant(name, path=source) if with_diffs and judged_survivor else ""
                    mutants.append(Mutant(name, folder, status, diff))
    return mutants


def load_reasons(path: Path) -> dict[tuple[str, str], str]:
    """(function, mutated line) -> reason, from the survivors document."""
    reasons = {}
    for number, line in enumerate(path.read_text().splitlines(), 1) if path.exists() else ():
        match = REASON_LINE.match(line)
        if match:
            key = (match["function"], match["mutated"])
            if key in reasons:
                raise ValueError(f"{path}:{number}: a second reason for {key}")
            reasons[key] = match["reason"]
    return reasons


def write_report(path: Path, mutants: list[Mutant], reasons: dict[tuple[str, str], str]) -> list[str]:
    """Writes every mutant that was not caught; returns the names of those without a reason."""
    unjustified, lines = [], ["# Mutants not caught by the fast profile", ""]
    for mutant in mutants:
        if mutant.status in CAUGHT or mutant.status == NOT_RUN:
            continue
        reason = reasons.get((mutant.function, mutant.mutated))
        if reason is None:
            unjustified.append(mutant.name)
        lines += [
            f"## {mutant.name} ({mutant.status})",
            "",
            f"- `{mutant.function}`: `{mutant.mutated}` — {reason or 'NO REASON GIVEN'}",
            "",
            "```diff",
            mutant.diff,
            "```",
            "",
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return unjustified


def print_summary(mutants: list[Mutant], seconds: dict[str, float]) -> None:
    """Per folder: mutants, how many were run, killed / survived / timed out / other, and the score of those run."""
    print(
        f"{'folder':<10} {'mutants':>8} {'run':>6} {'killed':>7} {'survived':>9} {'timeout':>8} {'other':>6} "
        f"{'score':>7}  time"
    )
    for folder, wall in seconds.items():
        counts = Counter(m.status for m in mutants if m.folder == folder)
        run = sum(counts.values()) - counts[NOT_RUN]
        caught = sum(counts[s] for s in CAUGHT)
        other = run - counts["killed"] - counts["survived"] - counts["timeout"]
        score = f"{100 * caught / run:.1f}%" if run else "n/a"
        print(
            f"{folder:<10} {sum(counts.values()):>8} {run:>6} {counts['killed']:>7} {counts['survived']:>9} "
            f"{counts['timeout']:>8} {other:>6} {score:>7}  {wall:.0f} s"
        )
        if other:
            shown = ("killed", "survived", "timeout", NOT_RUN)
            rest = {status: n for status, n in counts.items() if status not in shown}
            print(f"{'':<10} other: {rest}")
