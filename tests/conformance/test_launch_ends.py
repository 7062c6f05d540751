"""How a launch ends, with every launcher: the rank that failed is blamed alone, and what it left behind
is ended with it.

Real command-line runs, one process per rank; marked slow.
"""

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from harness_cases import PLUGINS, small_cases, write_cases

pytestmark = pytest.mark.slow

LAUNCHERS = ["fork", "torchrun"]


def _conformance(tmp_path, *args, timeout=300, env=None):
    report = tmp_path / "r.json"
    env = dict(env or os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")]))
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
    args = ["--impl", entry, "--profile", "vllm-0.34-strict", "--case", "tp2-reject-extension-supported"]
    args += ["--launcher", launcher, "--timeout", "10"]
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


def _marked(mark: bytes) -> list[int]:
    """The processes whose environment holds ``mark`` (every process a run started inherits it)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and mark in pathlib.Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_no_process_of_a_launch_outlives_it(tmp_path, launcher):
    """A rank stopped by SIGSTOP, a rank holding the GIL and a daemon (double fork, a session of its own) a
    rank started: none is left after the run, with either launcher (torchrun left the stopped rank, the
    hung one and the daemon running, fork the daemon)."""
    entries = [f"hostile_sharders:{name}" for name in ("StopInGather", "GilHangInGather", "DaemonInGather")]
    files = write_cases(small_cases(2), tmp_path)
    mark = f"SHARDSPEC_TEST_LAUNCH_ENDS={tmp_path}"
    args = ["--impl", ",".join(entries), "--launcher", launcher, "--timeout", "6"]
    args += [arg for path in files for arg in ("--case-file", path)]
    try:
        proc, sections, _ = _conformance(tmp_path, *args, env={**os.environ, mark.split("=")[0]: str(tmp_path)})
        time.sleep(0.5)  # a process being ended is gone from /proc once reaped
        left = _marked(mark.encode())
    finally:
        for pid in _marked(mark.encode()):  # leave nothing behind, whatever failed
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert left == [], [
        pathlib.Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left if os.path.exists(f"/proc/{pid}")
    ]
    assert {c["status"] for c in sections[entries[2]].values()} == {"pass"}
    assert all(sections[entry]["small-tp2-3"]["status"] == "error" for entry in entries[:2])


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_rank_that_kills_its_parent_then_daemonises_leaves_nothing_behind(tmp_path, launcher):
    """Its daemon's parent is gone (the rank server, torchrun) before the launch ends: the judge, a subreaper,
    adopts it and ends it. Before, it and the rank were left running."""
    entry = "hostile_sharders:KillsItsParentThenDaemonInGather"
    files = write_cases(small_cases(2), tmp_path)
    mark = f"SHARDSPEC_TEST_LAUNCH_ENDS={tmp_path}"
    args = ["--impl", entry, "--launcher", launcher, "--timeout", "6"]
    args += [arg for path in files for arg in ("--case-file", path)]
    try:
        proc, sections, _ = _conformance(tmp_path, *args, env={**os.environ, mark.split("=")[0]: str(tmp_path)})
        time.sleep(0.5)
        left = _marked(mark.encode())
    finally:
        for pid in _marked(mark.encode()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert left == [], [
        pathlib.Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left if os.path.exists(f"/proc/{pid}")
    ]
    # Its verdict is its own (with fork the rank goes on and passes; torchrun's end takes the launch's cases).
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sections[entry]["small-tp2-3"]["status"] in ("pass", "error")


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_judge_killed_outright_leaves_no_rank_behind(tmp_path, launcher):
    """SIGKILL to the judge mid-launch (no handler of its runs): the process that started the ranks is told
    by the kernel (its parent died) and ends them, and what they started (a child in a session of its own).
    With fork, the rank server, the ranks and the child were left running."""
    files = write_cases(small_cases(2), tmp_path)
    mark = f"SHARDSPEC_TEST_LAUNCH_ENDS={tmp_path}"
    env = {**os.environ, mark.split("=")[0]: str(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "shardspec.conformance", "--impl", "hostile_sharders:ChildThenHangInGather"]
    command += ["--launcher", launcher, "--timeout", "60", "--run-dir", str(tmp_path / "run")]
    command += [arg for path in files[1:] for arg in ("--case-file", path)]  # the daemon's case first
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list((tmp_path / "run").rglob("launch0-rank*.frames")) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(4)  # rank 1 starts its child in the first case's gather, then hangs
        assert len(_marked(mark.encode())) >= 5  # the judge, what started the ranks, the ranks, the child
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 20
        while _marked(mark.encode()) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _marked(mark.encode())
    finally:
        proc.kill()
        for pid in _marked(mark.encode()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert left == []


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_daemon_holding_a_dead_ranks_sockets_costs_its_peer_no_wait(tmp_path, launcher):
    """Rank 1 starts a daemon (which holds a copy of its sockets), then raises before its all-gather: rank 0,
    waiting there, learns at once that rank 1 left, since the daemon is ended as soon as it is an orphan;
    before, it waited for its process-group timeout (30 s here: the job took 39 s with fork, 50 s with
    torchrun)."""
    entry = "hostile_sharders:DaemonThenRaiseInGather"
    [path] = write_cases(small_cases(2)[1:2], tmp_path)
    args = ["--impl", entry, "--case-file", path, "--launcher", launcher, "--timeout", "30", "--pg-timeout", "30"]
    proc, sections, _ = _conformance(tmp_path, *args)
    case = sections[entry]["small-tp2-3"]
    assert [(e["rank"], e["kind"]) for e in case["errors"]] == [(1, "raised"), (0, "peer")], case["errors"]
    # Its collective ends with the connection rank 1 closed, not at its timeout ("Timed out waiting 30000ms").
    assert "Timed out" not in case["errors"][1]["message"], case["errors"][1]


def test_under_torchrun_a_rank_killed_by_a_signal_is_named_died_with_its_signal(tmp_path):
    """torchrun's root cause names the rank that failed first and how: a segfault in gather is that rank's
    death with its signal (it was 'did not return', a hang), and its peer is not blamed."""
    entry = "hostile_sharders:SegfaultInGather"
    [path] = write_cases(small_cases(2)[1:2], tmp_path)
    proc, sections, _ = _conformance(tmp_path, "--impl", entry, "--case-file", path, "--launcher", "torchrun")
    case = sections[entry]["small-tp2-3"]
    first = case["errors"][0]
    assert (first["rank"], first["kind"], first["step"]) == (1, "died", "gather"), case["errors"]
    assert "rank 1 was killed by SIGSEGV in step gather of case small-tp2-3" in first["message"]
    assert case["violations"] == [] and all(
        e["kind"] in ("stopped", "peer", "peer-timeout") for e in case["errors"][1:]
    )
