"""bench/bench_step.py runs end to end (tiny sizes, Triton interpreter) and writes what it prints."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
STAND_IN = ROOT / "tests" / "conformance" / "plugins" / "vllm_style_batch_shard.py"


def test_quick_bench_with_an_upstream_column(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_step.py"), "--quick",
                           "--upstream", str(STAND_IN), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["settings"]["upstream"] == str(STAND_IN)
    assert [(r["tp"], r["num_reqs"], r["logits_per_req"]) for r in result["rows"]] == [
        (2, 4, 1), (2, 16, 1), (2, 4, 2), (2, 16, 2)]
    for row in result["rows"]:
        for impl in ("reference", "production", "upstream"):
            for op in ("shard", "gather", "step"):
                assert row[f"{impl}.{op}"]["wall_us"] > 0
    table_row = next(line for line in proc.stdout.splitlines() if line.startswith("  2    16   2 |"))
    assert table_row.count("x") == 6  # reference and upstream ratios of the three operations


def test_bad_upstream_path_is_named_before_any_timing(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_step.py"), "--quick",
                           "--upstream", str(tmp_path / "missing.py")],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode != 0
    assert "missing.py: no such file" in proc.stderr


def _site_of_this_tree(site: pathlib.Path) -> pathlib.Path:
    """What ``pip install --target site .`` lays out, as links into the tree (pyproject's package-dir)."""
    package = site / "shardspec"
    package.mkdir(parents=True)
    for module in (ROOT / "src" / "shardspec").glob("*.py"):
        (package / module.name).symlink_to(module)
    for folder in ("spec", "reference", "impl", "conformance", "fixtures"):
        (package / folder).symlink_to(ROOT / folder)
    return site


def test_in_process_ab_loads_two_installs_side_by_side(tmp_path):
    site = _site_of_this_tree(tmp_path / "site")
    ab = [sys.executable, str(ROOT / "bench" / "ab_inprocess.py")]
    small = ["--quick", "--num-reqs", "4", "--tp", "2", "--rounds", "2", "--calls", "1"]
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([*ab, str(site), str(site), *small], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [line.split(":")[0].strip() for line in proc.stdout.splitlines()[1:]] == ["shard", "gather", "step"]
    proc = subprocess.run([*ab, f"upstream:{STAND_IN}", str(site), *small], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([*ab, str(empty), str(site), *small], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)
    assert proc.returncode != 0 and f"{empty} holds no shardspec" in proc.stderr
