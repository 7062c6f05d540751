"""bench/step_counts.py: its counters count exactly what they say, and the tool runs end to end."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
STAND_IN = ROOT / "tests" / "conformance" / "plugins" / "vllm_style_batch_shard.py"
sys.path.insert(0, str(ROOT / "bench"))
import step_counts  # noqa: E402  (without a GPU, importing it selects the Triton interpreter)


def _helper(x):
    return x + 1


def test_python_calls_counts_frames_and_c_calls():
    def fn():
        _helper(1)
        _helper(2)
        len([1])

    python, c_calls = step_counts.python_calls(fn, calls=5)
    assert (python, c_calls) == (3, 1)  # fn and two helpers; len


def test_aten_operators_counts_dispatched_operators():
    assert step_counts.aten_operators(lambda: torch.empty(6).view(2, 3).add_(1), calls=4) == 3


def test_allocations_count_tensors_allocated():
    device = torch.device("cpu")
    allocs, device_ops = step_counts.allocations_and_device_ops(
        lambda: (torch.empty(6), torch.empty(6).view(2, 3), torch.zeros(2).clone()), calls=4, device=device
    )
    assert allocs == 4  # empty, empty, zeros, clone; the view allocates nothing
    assert device_ops != device_ops  # NaN: nothing to count without a GPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_synchronizations_are_counted_on_the_gpu():
    x = torch.ones(4, device="cuda")
    assert step_counts.synchronizations(lambda: x.sum().item(), calls=3, device=torch.device("cuda")) == 1


def test_quick_run_writes_every_count_for_every_implementation(tmp_path):
    out = tmp_path / "counts.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "step_counts.py"),
            "--quick",
            "--upstream",
            str(STAND_IN),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = json.loads(out.read_text())["counts"]
    assert set(counts) == {"reference", "production", "upstream"}
    for per_op in counts.values():
        assert set(per_op) == {"shard", "gather", "step"}
        assert all(per_op[op]["python"] > 0 for op in ("shard", "gather", "step"))
        # Production's shard may issue no operator at all (cached views); a gather always allocates.
        assert per_op["gather"]["aten"] > 0 and per_op["gather"]["allocs"] > 0
        # A step is shard, all-to-all and gather: never fewer operators than shard and gather.
        assert per_op["step"]["aten"] > per_op["shard"]["aten"] + per_op["gather"]["aten"]
    assert "shard   reference" in proc.stdout
