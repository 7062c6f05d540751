"""The suite's own cost: what a run over an implementation costs beside the same run over the reference.

    python bench/suite_cost.py [--tp 2] [--max-examples 10] [--repeats 1] [--upstream FILE]
        [--only LABEL] [--out bench/results/suite_cost.json] [-- more suite options]

Each subject is one command-line run of the suite (a process per rank, as users run it), measured
from outside: wall time, time per phase (startup and case collection until the first tp section, each
tp section, the report after the last), launches of the rank group (the run's "launch N" lines),
cases per second, and the errors that ended a launch (a rank died or hung). The subjects run
interleaved with their baseline, the reference under the same profile, and repeated in alternating
order, so the ratios compare runs made minutes apart on the same machine: absolute times on a
shared machine move; report the ratios.

Subjects: ``crashing_sharders:DiesInEveryGather`` and ``HangsHoldingTheGilInEveryGather`` (every
case ends its launch), and with ``--upstream`` (or $SHARDSPEC_UPSTREAM_FILE) vLLM's batch_shard.py
through examples/upstream_vllm with its known failures as xfails, under the profile it was written
for. The targets (issue: the cost of a crashing implementation): at most one relaunch per crash, and
a run at most twice the time of the same run over the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

ROOT = pathlib.Path(__file__).resolve().parent.parent
TP_START = re.compile(r"^== tp (\d+):")
TP_END = re.compile(r"^  tp (\d+): \d+ job\(s\) in")
CRASH_KINDS = ("died", "timeout")  # the errors that end a launch (harness/crashes.py)


@dataclass
class Subject:
    label: str
    impl: str
    profile: str
    args: list[str] = field(default_factory=list)
    pythonpath: list[str] = field(default_factory=list)


@dataclass
class Measured:
    label: str
    wall_s: float
    phases_s: dict[str, float]
    launches: int
    cases: int
    crashes: int
    statuses: dict[str, int]
    exit_code: int


def run_once(subject: Subject, tp: list[int], max_examples: int, extra: list[str]) -> Measured:
    with tempfile.TemporaryDirectory() as folder:
        report = pathlib.Path(folder) / "r.json"
        command = [sys.executable, "-m", "shardspec.conformance", "--impl", subject.impl, "--profile", subject.profile]
        command += ["--tp", ",".join(map(str, tp)), "--max-examples", str(max_examples), "--json", str(report)]
        command += ["--run-dir", str(pathlib.Path(folder) / "run"), *subject.args, *extra]
        path = os.pathsep.join([*subject.pythonpath, os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONPATH": path}
        start = time.perf_counter()
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        marks: list[tuple[float, str]] = [(time.perf_counter() - start, line.rstrip("\n")) for line in proc.stdout]
        proc.wait()
        wall = time.perf_counter() - start
        if not report.exists():
            tail = "\n".join(line for _, line in marks[-20:])
            raise SystemExit(f"{subject.label}: the run wrote no report (exit {proc.returncode}):\n{tail}")
        data = json.loads(report.read_text())
    cases = [case for section in data["sections"] for case in section["cases"]]
    statuses: dict[str, int] = {}
    for case in cases:
        statuses[case["status"]] = statuses.get(case["status"], 0) + 1
    crashes = sum(1 for case in cases if case.get("errors") and case["errors"][0].get("kind") in CRASH_KINDS)
    return Measured(
        subject.label,
        round(wall, 2),
        phases(marks, wall),
        sum(1 for _, line in marks if line.startswith("  launch ")),
        len(cases),
        crashes,
        statuses,
        proc.returncode,
    )


def phases(marks: list[tuple[float, str]], wall: float) -> dict[str, float]:
    """Seconds from the start to the first tp section, in each tp section, and after the last one."""
    out: dict[str, float] = {}
    first = next((t for t, line in marks if TP_START.match(line)), wall)
    out["startup and cases"] = round(first, 2)
    last, opened = first, {}
    for t, line in marks:
        if m := TP_START.match(line):
            opened[m.group(1)] = t
        elif (m := TP_END.match(line)) and m.group(1) in opened:
            out[f"tp {m.group(1)}"] = round(t - opened[m.group(1)], 2)
            last = t
    out["report"] = round(wall - last, 2)
    return out


def subjects(upstream: str | None) -> list[tuple[Subject, Subject]]:
    """(subject, its baseline) pairs."""
    bench = [str(ROOT / "bench")]
    pairs = []
    for name in ("DiesInEveryGather", "HangsHoldingTheGilInEveryGather"):
        reference = Subject("reference", "reference", "vllm-0.33")
        pairs.append((Subject(name, f"crashing_sharders:{name}", "vllm-0.33", pythonpath=bench), reference))
    if upstream:
        xfails = ["--xfails-file", str(ROOT / "examples/upstream_vllm/known_failures_seed.yaml")]
        example = [str(ROOT / "examples/upstream_vllm")]
        pairs.append(
            (
                Subject("vLLM's batch_shard.py", "shardspec_upstream:make_sharder", "vllm-seed", xfails, example),
                Subject("reference (vllm-seed)", "reference", "vllm-seed"),
            )
        )
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", default="2", help="tp sizes, comma-separated (default 2)")
    parser.add_argument("--max-examples", type=int, default=10, help="generated cases per tp (default 10)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each subject and baseline (default 1)")
    parser.add_argument("--upstream", default=os.environ.get("SHARDSPEC_UPSTREAM_FILE"), help="vLLM's batch_shard.py")
    parser.add_argument("--only", default="", help="run only the subjects whose label contains this")
    parser.add_argument("--out", default=str(ROOT / "bench/results/suite_cost.json"))
    parser.add_argument("extra", nargs="*", help="more options for every run, after --")
    args = parser.parse_args(argv)
    if args.upstream:
        os.environ["SHARDSPEC_UPSTREAM_FILE"] = str(pathlib.Path(args.upstream).resolve())
    tp = [int(t) for t in args.tp.split(",")]
    rows = []
    for subject, baseline in subjects(args.upstream):
        if args.only not in subject.label:
            continue
        runs: dict[str, list[Measured]] = {subject.label: [], baseline.label: []}
        for repeat in range(args.repeats):
            order = (subject, baseline) if repeat % 2 == 0 else (baseline, subject)
            for who in order:
                runs[who.label].append(run_once(who, tp, args.max_examples, args.extra))
        rows.append(compare(subject, baseline, runs))
        print_row(rows[-1])
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"tp": tp, "max_examples": args.max_examples, "repeats": args.repeats, "rows": rows}))
    print(f"wrote {out}")
    return 0


def compare(subject: Subject, baseline: Subject, runs: dict[str, list[Measured]]) -> dict:
    mine, base = runs[subject.label], runs[baseline.label]
    ratio = sorted(m.wall_s / b.wall_s for m, b in zip(mine, base, strict=True))[len(mine) // 2]
    extra_launches = [m.launches - b.launches for m, b in zip(mine, base, strict=True)]
    crashes = [m.crashes for m in mine]
    return {
        "subject": subject.label,
        "baseline": baseline.label,
        "time_ratio_median": round(ratio, 2),
        "relaunches_per_crash": [round(e / c, 2) if c else None for e, c in zip(extra_launches, crashes, strict=True)],
        "runs": [asdict(m) for m in mine],
        "baseline_runs": [asdict(b) for b in base],
    }


def print_row(row: dict) -> None:
    print(f"{row['subject']} against {row['baseline']}: time x{row['time_ratio_median']} (median of the pairs)")
    for m in row["runs"] + row["baseline_runs"]:
        rate = m["cases"] / m["wall_s"] if m["wall_s"] else 0.0
        print(
            f"  {m['label']}: {m['wall_s']:.1f} s, {m['cases']} cases ({rate:.2f}/s), {m['launches']} launches, "
            f"{m['crashes']} crashes, {m['statuses']}, exit {m['exit_code']}; phases {m['phases_s']}"
        )
    print(f"  relaunches per crash: {row['relaunches_per_crash']}")
    per_crash = [r for r in row["relaunches_per_crash"] if r is not None]
    met = row["time_ratio_median"] <= 2 and all(r <= 1 for r in per_crash)
    print(f"  target (time at most x2, at most one relaunch per crash): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    sys.exit(main())
