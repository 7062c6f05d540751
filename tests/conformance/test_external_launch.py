"""--launcher external: the judge joins ranks started by another launcher, here two torchrun
"nodes" on localhost sharing one c10d rendezvous; the verdicts equal those of the suite's own launch."""

import json
import os
import subprocess
import sys
import time

import pytest
from harness_cases import PLUGINS, small_cases, write_cases

from shardspec.conformance.harness.spawn import free_port

pytestmark = pytest.mark.slow
IMPL = "faulty_sharders:WrongCountsSharder"  # fails two of the three cases with a violation


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))


def _verdicts(report_path):
    cases = json.loads(report_path.read_text())["sections"][0]["cases"]
    return {
        c["case_id"]: (c["status"], sorted({(v["invariant_id"], v["rank"]) for v in c["violations"]})) for c in cases
    }


def _suite(folder, files, *extra):
    command = [
        sys.executable,
        "-m",
        "shardspec.conformance",
        "--impl",
        IMPL,
        "--tp",
        "2",
        "--no-shrink",
        "--json",
        str(folder / "r.json"),
        "--run-dir",
        str(folder / "run"),
        *extra,
    ]
    return command + [arg for path in files for arg in ("--case-file", path)]


def test_two_nodes_on_one_rendezvous_give_the_verdicts_of_one_launch(tmp_path):
    files = write_cases(small_cases(2), tmp_path)
    own, joined = tmp_path / "own", tmp_path / "joined"
    own.mkdir()
    joined.mkdir()
    subprocess.run(_suite(own, files), env=_env(), capture_output=True, text=True, timeout=300)

    judge = subprocess.Popen(
        _suite(joined, files, "--launcher", "external"),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    launch = joined / "run" / "tp2" / "launch0.json"
    deadline = time.monotonic() + 120
    while not launch.exists() and time.monotonic() < deadline:
        time.sleep(0.3)
    port = free_port()
    node = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "shardspec-test",
        "-m",
        "shardspec.conformance.harness.worker",
        str(launch.parent),
        str(launch),
    ]
    nodes = [subprocess.Popen(node, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
    out, _ = judge.communicate(timeout=300)
    for process in nodes:
        process.wait(timeout=60)
    assert judge.returncode == 1, out[-3000:]
    assert "waiting for 2 ranks started by your launcher" in out and "--rdzv-backend c10d" in out
    assert _verdicts(joined / "r.json") == _verdicts(own / "r.json")
    assert {status for status, _ in _verdicts(own / "r.json").values()} == {"pass", "fail"}


def test_external_launch_needs_one_group_size_and_a_run_dir(tmp_path, capsys):
    from shardspec.conformance.cli import main

    assert main(["--launcher", "external", "--tp", "2,4", "--run-dir", str(tmp_path / "run")]) == 2
    assert "one group size" in capsys.readouterr().err
    assert main(["--launcher", "external", "--tp", "2"]) == 2
    assert "--run-dir that every node can read and write" in capsys.readouterr().err


def test_a_rank_started_by_srun_gets_torch_distributed_variables():
    from shardspec.conformance.harness.external import adopt_slurm_environment

    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "MASTER_ADDR": "n0", "MASTER_PORT": "29500"}
    adopt_slurm_environment(env)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("5", "8", "1")
    with pytest.raises(RuntimeError, match="MASTER_ADDR and MASTER_PORT"):
        adopt_slurm_environment({"SLURM_PROCID": "0"})
    torchrun = {"RANK": "3", "SLURM_PROCID": "0"}
    adopt_slurm_environment(torchrun)
    assert torchrun["RANK"] == "3"  # started by torchrun inside an allocation: its variables win
