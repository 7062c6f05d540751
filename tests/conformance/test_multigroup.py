"""Worlds of several TP groups: 4 processes as 2 TP groups of 2, started by torchrun and joined with
``--launcher external --tp 2``. Every group runs every case and is judged; the reference passes, and a
collective on any group but a rank's own TP group fails INV-WIRE-SEQUENCE, naming the group. A group an
implementation builds over exactly its TP group's ranks counts as that TP group where the whole step runs on
it; a step split between it and the TP group fails."""

import json
import os
import subprocess
import sys
import time

import pytest
from harness_cases import PLUGINS, small_cases, write_cases

from shardspec.conformance.harness.spawn import free_port

pytestmark = pytest.mark.slow
BROKEN = "shardspec.conformance.broken.collectives"
IMPLS = ["reference", f"{BROKEN}:GatherOnADuplicateGroup", f"{BROKEN}:BarrierOnTheDefaultGroup"]


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))


@pytest.fixture(scope="module")
def world_of_two_groups(tmp_path_factory):
    folder = tmp_path_factory.mktemp("multigroup")
    files = write_cases(small_cases(2)[:2], folder)
    command = [sys.executable, "-m", "shardspec.conformance", "--impl", ",".join(IMPLS), "--tp", "2"]
    command += ["--no-shrink", "--launcher", "external", "--run-dir", str(folder / "run")]
    command += ["--json", str(folder / "r.json"), *[arg for path in files for arg in ("--case-file", path)]]
    log = folder / "judge.log"
    with open(log, "w") as stream:
        judge = subprocess.Popen(command, env=_env(), stdout=stream, stderr=subprocess.STDOUT, text=True)
        worlds = _start_each_launch(judge, folder / "run" / "tp2")
    for world in worlds:
        world.wait(timeout=60)
    report = json.loads((folder / "r.json").read_text())
    sections = {section["implementation"]: section["cases"] for section in report["sections"]}
    return judge.returncode, log.read_text(), sections


def _start_each_launch(judge, folder, limit_s: float = 300.0) -> list:
    """A world of 4 ranks for each launch file the judge writes, as the external launcher's user starts one per
    printed command: each entry of the run has launches of its own."""
    worlds, started = [], set()
    deadline = time.monotonic() + limit_s
    while judge.poll() is None and time.monotonic() < deadline:
        for launch in sorted(folder.glob("launch*.json")) if folder.is_dir() else ():
            if launch.name in started or not launch.stem[len("launch") :].isdigit():
                continue
            started.add(launch.name)
            ranks = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "4"]
            ranks += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
            ranks += ["-m", "shardspec.conformance.harness.worker", str(folder), str(launch)]
            worlds.append(subprocess.Popen(ranks, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.3)
    if judge.poll() is None:
        judge.kill()
    judge.wait(timeout=60)
    return worlds


def test_the_reference_passes_in_every_tp_group(world_of_two_groups):
    returncode, out, sections = world_of_two_groups
    assert returncode == 1, out[-3000:]  # the broken entries fail
    assert [c["status"] for c in sections["reference"]] == ["pass", "pass"], sections["reference"]
    assert all(c["judged"] and "INV-WIRE-SEQUENCE" in c["judged"] for c in sections["reference"])


def test_a_gather_on_a_group_of_its_own_fails_in_each_tp_group(world_of_two_groups):
    _, out, sections = world_of_two_groups
    for case in sections[IMPLS[1]]:
        assert case["status"] == "fail", case
        messages = [v["message"] for v in case["violations"] if v["invariant_id"] == "INV-WIRE-SEQUENCE"]
        for group, ranks in ((0, "[0, 1]"), (1, "[2, 3]")):
            assert any(
                m.startswith(f"TP group {group} (world ranks")
                and f"(all_gather_into_tensor) was issued on a group of the TP group's world ranks {ranks} built by"
                in m
                and "collective 0 on the TP group" in m
                for m in messages
            ), messages


def test_a_barrier_on_the_default_group_names_the_world(world_of_two_groups):
    _, out, sections = world_of_two_groups
    for case in sections[IMPLS[2]]:
        assert case["status"] == "fail", case
        messages = [v["message"] for v in case["violations"] if v["invariant_id"] == "INV-WIRE-SEQUENCE"]
        assert any("(barrier) was issued on the default group (world ranks [0, 1, 2, 3])" in m for m in messages)


def test_the_suites_own_launch_runs_two_tp_groups_and_names_the_failing_one(tmp_path, monkeypatch):
    """LaunchOptions.tp_groups: the fork launcher starts 4 ranks as 2 TP groups of 2; the reference passes in
    both, an extra functional all_reduce fails INV-WIRE-SEQUENCE in each, each message naming its group, and
    one issued in TP group 1 alone fails there alone."""
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    from shardspec.conformance.api import ImplChoice
    from shardspec.conformance.harness.group import Job
    from shardspec.conformance.harness.multiprocess import LaunchOptions, run_jobs_multiprocess
    from shardspec.conformance.replay import suite_judge

    cases = small_cases(2)[:2]
    impls = ("reference", f"{BROKEN}:ExtraFunctionalAllReduce", "recording_world:ExtraAllReduceInTheLastTpGroup")
    impls += ("shardspec.conformance.broken.conforming:EveryCallOnAGroupOfItsOwn",)
    jobs = [Job(ImplChoice(impl), case) for impl in impls for case in cases]
    options = LaunchOptions(tmp_path / "run", case_timeout_s=60, pg_timeout_s=60, launcher="fork", tp_groups=2)
    servers: dict = {}
    try:
        results = run_jobs_multiprocess(jobs, 2, options, suite_judge(), log=lambda line: None, servers=servers)
    finally:
        for server in servers.values():
            server.close()
    # A group each TP group builds over exactly its own ranks, for every call of the step, is its TP group.
    statuses = ["pass", "pass"] + ["fail"] * 4 + ["pass", "pass"]
    assert [r.status for r in results] == statuses, [(r.status, r.errors, r.violations) for r in results]

    def groups_failing_the_sequence(result):
        return {v["message"].split(":")[0] for v in result.violations if v["invariant_id"] == "INV-WIRE-SEQUENCE"}

    for result in results[2:4]:
        assert groups_failing_the_sequence(result) == {"TP group 0 (world ranks 0-1)", "TP group 1 (world ranks 2-3)"}
    for result in results[4:6]:
        assert groups_failing_the_sequence(result) == {"TP group 1 (world ranks 2-3)"}, result.violations


def test_tp_groups_runs_each_case_in_two_tp_groups_from_the_command_line(tmp_path):
    """--tp-groups 2 --tp 2: each case runs in both TP groups of one launched world of 4 ranks; an extra
    all_reduce in TP group 1 alone fails there alone, and the reference passes."""
    files = write_cases(small_cases(2)[:1], tmp_path)
    impls = ["reference", "recording_world:ExtraAllReduceInTheLastTpGroup"]
    command = [sys.executable, "-m", "shardspec.conformance", "--impl", ",".join(impls), "--tp", "2"]
    command += ["--tp-groups", "2", "--no-shrink", "--json", str(tmp_path / "r.json"), "--case-file", files[0]]
    run = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert "2 TP groups per world" in run.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    sections = {section["implementation"]: section["cases"] for section in report["sections"]}
    assert [c["status"] for c in sections["reference"]] == ["pass"]
    [case] = sections[impls[1]]
    messages = [v["message"] for v in case["violations"] if v["invariant_id"] == "INV-WIRE-SEQUENCE"]
    assert messages and all(m.startswith("TP group 1 (world ranks 2-3)") for m in messages), messages


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp-groups", "2", "--in-process"], "not --in-process"),
        (["--tp-groups", "2", "--launcher", "external", "--tp", "2", "--run-dir", "RUN"], "your launcher's world"),
        (["--tp-groups", "8", "--tp", "16"], "above 64"),
        (["--tp-groups", "9"], "above 8"),
    ],
)
def test_tp_groups_refuses_what_it_cannot_run(tmp_path, args, message):
    args = [str(tmp_path / "run") if arg == "RUN" else arg for arg in args]
    run = subprocess.run([sys.executable, "-m", "shardspec.conformance", *args], capture_output=True, text=True)
    assert run.returncode == 2 and message in run.stderr and "--tp-groups" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
