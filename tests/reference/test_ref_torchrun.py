"""The reference over real gloo collectives (torchrun, one process per rank) is transparent."""

import json
import pathlib
import subprocess
import sys

import pytest

WORKER = pathlib.Path(__file__).with_name("torchrun_transparency.py")


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8])
def test_sharded_step_over_gloo_equals_the_replicated_path(tp, tmp_path):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(tp),
        "--standalone",
        str(WORKER),
        str(tmp_path),
    ]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"tp {tp}: torchrun did not finish within {exc.timeout}s; reproduce: {' '.join(command)}")
    assert proc.returncode == 0, f"reproduce: {' '.join(command)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    records = [
        json.loads(line) for rank in range(tp) for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()
    ]
    assert len({r["case"] for r in records}) >= 4, "too few cases ran"
    failures = [f"rank {r['rank']} case {r['case']}: {', '.join(r['problems'])}" for r in records if r["problems"]]
    assert not failures, "\n".join(failures)
