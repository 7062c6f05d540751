"""Whether each vLLM defect a release's known-failures file lists still reproduces on the installed package.

    python examples/vllm/defects/reproduce.py examples/vllm/known_failures_0.34.yaml --profile vllm-0.34

Every item of the file with ``why: vllm-defect`` names its report (``defect: <id>``): ``<id>.md`` beside this
script, and ``<id>.yaml``, its smallest case. One suite run (no known failures, no shrinking) judges every
case file; a defect reproduces when each invariant its item lists fails on its case. Exit 0 when every defect
reproduces; 1 when one does not (fixed upstream? then its item and report go); 2 when the run could not be
made or judged nothing. ``--impl`` judges another implementation (the tests use the reference, which
reproduces none of them).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

from shardspec.conformance.report.xfails import load_xfails

HERE = pathlib.Path(__file__).resolve().parent
ADAPTER = HERE.parent  # examples/vllm: shardspec_vllm.py


def defects_of(known_failures: str) -> dict[str, tuple[str, ...]]:
    """Each defect id the file's items name, with the invariants (run-error aside) those items list."""
    out: dict[str, tuple[str, ...]] = {}
    for item in load_xfails(known_failures).known:
        if item.why.endswith("defect"):
            if item.defect is None:
                raise ValueError(f"known failure {item.label!r}: a {item.why} item names no report (defect: <id>)")
            out[item.defect] = out.get(item.defect, ()) + tuple(i for i in item.invariants if i.startswith("INV-"))
    return out


def failed_invariants(report: dict) -> dict[str, set[str]]:
    """Case id (a multi-step case's steps under its own id) -> the invariants that failed on it."""
    out: dict[str, set[str]] = {}
    for section in report.get("sections", []):
        for case in section.get("cases", []):
            case_id = case["case_id"].split(".step")[0]
            out.setdefault(case_id, set()).update(v["invariant_id"] for v in case.get("violations", []))
    return out


def run(defects: dict[str, tuple[str, ...]], profile: str, impl: str, tp: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="shardspec-defects-") as folder:
        report = pathlib.Path(folder) / "report.json"
        command = [sys.executable, "-m", "shardspec.conformance", "--impl", impl, "--profile", profile]
        command += ["--tp", str(tp), "--no-shrink", "--timeout", "60", "--json", str(report)]
        for defect in defects:
            command += ["--case-file", str(HERE / f"{defect}.yaml")]
        path = os.pathsep.join(p for p in (str(ADAPTER), os.environ.get("PYTHONPATH", "")) if p)
        subprocess.run(command, env={**os.environ, "PYTHONPATH": path}, check=False)
        return json.loads(report.read_text()) if report.is_file() else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("known_failures", help="a release's known-failures file (examples/vllm/known_failures_*.yaml)")
    parser.add_argument("--profile", required=True, help="the release's profile, e.g. vllm-0.34")
    parser.add_argument("--impl", default="shardspec_vllm:make_sharder", help="what to judge (default: vLLM)")
    parser.add_argument("--tp", type=int, default=2, help="the group size of the cases (default 2)")
    args = parser.parse_args(argv)
    try:
        defects = defects_of(args.known_failures)
    except (OSError, ValueError) as error:
        print(f"reproduce: {args.known_failures}: {error}", file=sys.stderr)
        return 2
    if not defects:
        print(f"reproduce: {args.known_failures} lists no defect")
        return 0
    failed = failed_invariants(run(defects, args.profile, args.impl, args.tp))
    if not failed:
        print("reproduce: the run judged no case (see its output above)", file=sys.stderr)
        return 2
    lines = judge(defects, failed)
    print("\n".join(lines))
    return 1 if any(line.startswith("does not") for line in lines) else 0


def judge(defects: dict[str, tuple[str, ...]], failed: dict[str, set[str]]) -> list[str]:
    """One line per defect: it reproduces when every invariant of its items failed on its case."""
    lines = []
    for defect, invariants in sorted(defects.items()):
        missing = sorted(set(invariants) - failed.get(defect, set()))
        if missing:
            lines.append(f"does not reproduce: {defect} ({', '.join(missing)} did not fail on {defect}.yaml)")
        else:
            lines.append(f"reproduces: {defect} ({', '.join(sorted(set(invariants)))} fail on {defect}.yaml)")
    return lines


if __name__ == "__main__":
    sys.exit(main())
