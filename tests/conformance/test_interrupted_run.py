"""A run interrupted (SIGINT, SIGTERM) while its ranks run: every case, judged or not, says how to reproduce it."""

import json
import signal
import subprocess
import sys

import pytest
from harness_cases import small_cases, write_cases

from shardspec.conformance.harness.probe import probe
from shardspec.conformance.record import FAIL, CaseResult
from shardspec.conformance.run.config import RunConfig
from shardspec.conformance.run.session import ConformanceSession
from shardspec.spec.profiles import rules_of


class InterruptedGroup:
    """Judges the first job a failure, then the run is interrupted (as SIGINT raises in the judge)."""

    def describe(self) -> str:
        return "a group interrupted after its first job"

    def probe(self, names, rules, warnings, releases):
        return probe(names, rules, warnings=warnings, releases=releases)

    def run(self, jobs, tp, judge, on_result):
        violation = {"invariant_id": "INV-OWNER", "message": "wrong owner", "rank": 0, "request": None, "field": None}
        on_result(CaseResult(jobs[0].case, jobs[0].choice.label, FAIL, violations=[violation]))
        raise KeyboardInterrupt("SIGINT")

    def close(self) -> None:
        pass


def test_an_interruption_keeps_every_reproduce_command(tmp_path):
    """Fixture cases (``--case ID``) and case files alike: before, 10 of 11 failures printed an empty
    ``reproduce:`` line after an interruption, since the commands were made once a group size had run."""
    files = write_cases(small_cases(2), tmp_path)
    config = RunConfig(
        impls=["reference"],
        case_ids=["tp2-decode", "tp2-reject-slot-unique"],
        rules=rules_of("vllm-0.34-strict"),  # where a must-reject case is inside the contract
        case_files=files,
        run_dir=tmp_path / "run",
        json_path=str(tmp_path / "r.json"),
        shrink=False,
    )
    lines: list[str] = []
    session = ConformanceSession(config, log=lines.append)
    session.group = InterruptedGroup()
    try:
        session.run_all()
    except KeyboardInterrupt:
        pass
    assert session.finish(interrupted="SIGINT") == 130
    cases = {c["case_id"]: c for c in json.loads((tmp_path / "r.json").read_text())["sections"][0]["cases"]}
    assert set(cases) == {"tp2-decode", "tp2-reject-slot-unique", *(c.case_id for c in small_cases(2))}
    prefix = "python -m shardspec.conformance --impl reference --profile vllm-0.34-strict"
    assert cases["tp2-decode"]["reproduce"] == f"{prefix} --case tp2-decode", cases["tp2-decode"]
    assert cases["tp2-reject-slot-unique"]["reproduce"] == f"{prefix} --case tp2-reject-slot-unique"
    for path in files:
        case_id = path.rsplit("/", 1)[1].removesuffix(".yaml")
        assert cases[case_id]["reproduce"] == f"{prefix} --case-file {path}", cases[case_id]
    text = "\n".join(lines)
    assert "reproduce: python -m shardspec.conformance" in text
    assert "reproduce: \n" not in text + "\n" and not any(line.rstrip().endswith("reproduce:") for line in lines)


# A run in a child process whose signals arrive where the test says: while its cases are made, or as its
# first group size runs and twice more while it ends (Ctrl-C pressed three times).
_SIGNALLED_RUN = """
import os, signal, sys, time
import shardspec.conformance.run.session as session

signum = getattr(signal, sys.argv[1])
where = sys.argv[2]

def signalled(*args, **kwargs):
    os.kill(os.getpid(), signum)
    time.sleep(60)

if where == "making-cases":
    session.collect_cases = signalled
else:
    session.run_group_size = signalled
    finish = session.ConformanceSession.finish

    def pressed_again(self, *args, **kwargs):
        for _ in range(2):
            os.kill(os.getpid(), signum)
            time.sleep(0.2)
        return finish(self, *args, **kwargs)

    session.ConformanceSession.finish = pressed_again
from shardspec.conformance.cli import main
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.parametrize(
    "signame, where",
    [("SIGINT", "making-cases"), ("SIGTERM", "making-cases"), ("SIGINT", "running"), ("SIGTERM", "running")],
)
def test_any_signal_leaves_a_report_and_no_traceback(tmp_path, signame, where):
    """Before, SIGINT while the cases were made exited 2 with no output (SIGTERM killed the run silently), and
    Ctrl-C pressed three times ended in a traceback and no JSON."""
    report = tmp_path / "r.json"
    command = [sys.executable, "-c", _SIGNALLED_RUN, signame, where, "--in-process", "--tp", "2"]
    command += ["--max-examples", "1", "--json", str(report)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    status = 128 + getattr(signal, signame)
    assert proc.returncode == status and "Traceback" not in output, output[-3000:]
    data = json.loads(report.read_text())
    assert data["exit_code"] == status and f"interrupted by {signame}" in " ".join(data["warnings"]), data["warnings"]
    if where == "making-cases":
        assert f"interrupted by {signame} before any case was judged" in proc.stdout, output[-3000:]
    else:
        assert proc.stdout.count(f"{signame} again: the run is ending") == 2, output[-3000:]
