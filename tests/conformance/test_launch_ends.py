"""How a launch ends, with every launcher: the rank that failed is blamed alone, and what it left behind
is ended with it.

Real command-line runs, one process per rank; marked slow.
"""

import json
import os
import subprocess
import sys

import pytest
from harness_cases import PLUGINS

pytestmark = pytest.mark.slow

LAUNCHERS = ["fork", "torchrun"]


def _conformance(tmp_path, *args, timeout=300):
    report = tmp_path / "r.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "shardspec.conformance", "--no-shrink", "--json", str(report)]
    command += ["--run-dir", str(tmp_path / "run"), *args]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    data = json.loads(report.read_text())
    return proc, {s["implementation"]: {c["case_id"]: c for c in s["cases"]} for s in data["sections"]}, data


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_peer_that_lost_its_partner_is_not_blamed(tmp_path, launcher):
    """Rank 0 calls sys.exit before the all-to-all of a case whose inputs rank 1 must reject in the gather:
    rank 1 loses its peer in the all-to-all. Rank 0 is the one error that is its own (died, with its exit
    status, with torchrun too); rank 1 fails no invariant (it failed INV-REJECT-INVALID under torchrun)."""
    entry = "hostile_sharders:ExitOnRankZeroInAllToAll"
    args = ["--impl", entry, "--case", "tp2-reject-extension-supported", "--launcher", launcher, "--timeout", "10"]
    proc, sections, _ = _conformance(tmp_path, *args)
    case = sections[entry]["tp2-reject-extension-supported"]
    assert case["status"] == "error" and case["violations"] == [], case
    first = case["errors"][0]
    assert (first["rank"], first["kind"], first["step"]) == (0, "died", "all_to_all"), case["errors"]
    assert "rank 0 exited with status 3 in step all_to_all" in first["message"], first
    assert all(e["kind"] in ("stopped", "peer", "peer-timeout") for e in case["errors"] if e["rank"] == 1), case
    assert "INV-REJECT-INVALID" not in proc.stdout.split("failures:")[-1]


def test_a_launch_that_did_not_run_says_why_in_the_terminal_the_json_and_the_html(tmp_path):
    """Every rank dies before its first case: the terminal, the JSON and the HTML report say why (the reason,
    the first lines of the rank's error, the full log's path), not only that no case was judged."""
    from shardspec.conformance.report.html import main as html_report

    entry = "breaks_its_ranks:X"
    proc, sections, data = _conformance(tmp_path, "--impl", entry, "--case", "tp2-decode", "--launcher", "fork")
    assert proc.returncode == 1
    assert sections[entry]["tp2-decode"]["status"] == "not-run"
    error = "RuntimeError: expected[0].wire[0].send: AttributeError: 'torch.device' object has no attribute"
    [failure] = data["launch_failures"]
    assert (failure["tp"], failure["launch"], failure["reason"]) == (2, 1, "the group did not start (exit 1)")
    assert failure["error"].startswith("Traceback (most recent call last)") and error in failure["error"]
    assert failure["log"] == str(tmp_path / "run" / "tp2" / "launch0.log")
    report = proc.stdout.split("launches that did not run")[-1]
    assert "tp 2, launch 1: the group did not start (exit 1)" in report, proc.stdout[-3000:]
    assert error in report and "Traceback (most recent call last)" in report
    assert f"full log: {failure['log']}" in report
    assert "error: no case was judged: the run proves nothing (1 launch(es) did not run: see above)" in proc.stdout
    assert html_report([str(tmp_path / "r.json"), "-o", str(tmp_path / "html")]) == 0
    page = (tmp_path / "html" / "index.html").read_text()
    assert "tp 2, launch 1 did not run: the group did not start (exit 1)" in page
    assert "RuntimeError: expected[0].wire[0].send" in page and failure["log"] in page
