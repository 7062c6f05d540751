"""bench/bench_step.py runs end to end (tiny sizes, Triton interpreter) and writes what it prints."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import vllm_files

ROOT = pathlib.Path(__file__).resolve().parents[1]
STAND_IN = ROOT / "tests" / "conformance" / "plugins" / "vllm_style_batch_shard.py"


def _quick_bench(tmp_path, upstream: pathlib.Path):
    """bench_step.py --quick with ``upstream`` as its third column: (the process, the JSON it wrote)."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_step.py"), "--quick", "--upstream", str(upstream)]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TRITON_INTERPRET="1"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads(out.read_text())


def test_quick_bench_with_an_upstream_column(tmp_path):
    proc, result = _quick_bench(tmp_path, STAND_IN)
    assert result["settings"]["upstream"] == str(STAND_IN)
    assert [(r["tp"], r["num_reqs"], r["logits_per_req"]) for r in result["rows"]] == [
        (2, 4, 1),
        (2, 16, 1),
        (2, 4, 2),
        (2, 16, 2),
    ]
    for row in result["rows"]:
        for impl in ("reference", "production", "upstream"):
            for op in ("shard", "gather", "step"):
                assert row[f"{impl}.{op}"]["wall_us"] > 0
    table_row = next(line for line in proc.stdout.splitlines() if line.startswith("  2    16   2 |"))
    assert table_row.count("x") == 6  # reference and upstream ratios of the three operations


def test_bad_upstream_path_is_named_before_any_timing(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_step.py"), "--quick", "--upstream", str(tmp_path / "missing.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TRITON_INTERPRET="1"),
    )
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
    proc = subprocess.run(
        [*ab, str(site), str(site), *small], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [line.split(":")[0].strip() for line in proc.stdout.splitlines()[1:]] == ["shard", "gather", "step"]
    proc = subprocess.run(
        [*ab, f"upstream:{STAND_IN}", str(site), *small],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run(
        [*ab, str(empty), str(site), *small], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    assert proc.returncode == 2 and f"{empty} holds no shardspec" in proc.stderr
    # A side under a named profile: that profile's sharder, or a one-line refusal naming the profile.
    for profile, status in (("vllm-seed", 0), ("no-such-profile", 2)):
        proc = subprocess.run(
            [*ab, str(site), f"{site}@{profile}", *small],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=tmp_path,
        )
        assert proc.returncode == status, proc.stdout + proc.stderr
        assert status == 0 or ("no-such-profile" in proc.stderr and "Traceback" not in proc.stderr)


def test_scale_grid_quick_writes_json_and_plots(tmp_path):
    """The deployment-scale grid end to end on tiny shapes: every part, floors, ratios, the PNGs."""
    out, plots = tmp_path / "scale.json", tmp_path / "plots"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "scale_grid.py"),
            "--quick",
            "--upstream",
            str(STAND_IN),
            "--out",
            str(out),
            "--plots",
            str(plots),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TRITON_INTERPRET="1"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["implementations"] == ["production", "upstream"]
    assert result["floors"]["copy"]["bytes_per_s"] > 0 and result["floors"]["launch"]["wall_us"] > 0
    assert {(r["vocab"], r["dtype"], r["num_reqs"]) for r in result["step"]} == {
        (256, dtype, n) for dtype in ("bfloat16", "float32") for n in (1, 8)
    }
    for row in result["step"]:
        # Rank 0 is the most loaded rank: ceil(requests / tp) requests of 2 rows each.
        assert row["num_local_logits"] == -(-row["num_reqs"] // 2) * 2
        assert row["bytes"]["must_move"] == (row["num_reqs"] * 2 * 128 + row["num_local_logits"] * 256) * (
            2 if row["dtype"] == "bfloat16" else 4
        )
        assert row["production"]["q1"] <= row["production"]["median"] <= row["production"]["q3"]
        assert row["production"]["x_floor"] == row["production"]["median"] / row["floor_us"]
        assert row["production_over_upstream"]["n"] == 2
    assert {r["sampler"] for r in result["baseline"]} == {"greedy", "top_p", "top_p_sort_free"}
    for row in result["baseline"]:
        assert row["replicated"]["median"] > 0 and row["sharded"]["median"] > 0
    assert result["focus"]["production_over_upstream"]["median"] > 0
    assert sorted(p.name for p in plots.iterdir()) == [
        "baseline_memory.png",
        "baseline_time.png",
        "step_time_bfloat16.png",
        "step_time_float32.png",
    ]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in plots.iterdir())
    assert "prod/vLLM" in proc.stdout


def test_scale_grid_rejects_an_unknown_part():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scale_grid.py"), "--quick", "--parts", "step,floor"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TRITON_INTERPRET="1"),
    )
    assert proc.returncode != 0 and "unknown part(s) ['floor']" in proc.stderr


def test_wire_layout_prototypes_match_todays_exchange(tmp_path):
    """Both prototypes are checked against today's all-to-all before they are timed; the run fails otherwise."""
    out = tmp_path / "wire.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "wire_layout.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TRITON_INTERPRET="1"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert [(r["tp"], r["num_local_logits"]) for r in result["exchange"]] == [(2, 8), (2, 4)]
    assert set(result["exchange"][0]["ratios"]) == {
        "exchange: vocab_major / today",
        "greedy: vocab_major / today",
        "greedy: fused / today",
        "top_p: vocab_major / today",
    }
    assert result["lm_head"][0]["per_destination"]["median"] > 0


def test_wire_layout_check_names_a_wrong_fused_result(monkeypatch):
    """The check is not vacuous: a fused consumer that returns another argmax is caught."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import torch
    import wire_layout
    from scale_shapes import ScaleShape

    shape = ScaleShape(8, 2, 2, 256, "float32", capacity=(16, 2), num_logprobs=0, device=torch.device("cpu"))
    exchange = wire_layout.Exchange(shape)
    wire_layout.check(exchange)
    real = exchange.fused
    monkeypatch.setattr(exchange, "fused", lambda: (real()[0] + 1, real()[1]))
    with pytest.raises(AssertionError, match="argmax differs in 8 rows"):
        wire_layout.check(exchange)


def test_nvlink_model_document_is_generated_from_the_script(monkeypatch):
    """bench/NVLINK_MODEL.md is what bench/nvlink_model.py writes (edit the script, then regenerate)."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import nvlink_model

    assert (ROOT / "bench" / "NVLINK_MODEL.md").read_text() == nvlink_model.document(4.0)
    large = nvlink_model.model(4096, 8, 262144, 2, 4e6)
    # Per rank the all-gather carries tp times the all-to-all's bytes.
    assert abs(large["ag_mb"] / large["a2a_mb"] - nvlink_model.TP) < 1e-9


def test_sort_free_top_p_keeps_the_tokens_the_sorting_one_keeps(monkeypatch):
    """Same kept set, hence the same draw from the same generator; a token above p is the only one kept."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import samplers
    import torch

    torch.manual_seed(0)
    for seed in range(8):
        logits = torch.randn(32, 500) * 3
        drawn = [fn(logits, torch.Generator().manual_seed(seed)) for fn in (samplers.top_p, samplers.top_p_sort_free)]
        assert torch.equal(*drawn), seed
    peaked = torch.zeros(4, 500)
    peaked[:, 7] = 10.0  # probability above 0.9
    for seed in range(8):
        assert samplers.top_p_sort_free(peaked, torch.Generator().manual_seed(seed)).tolist() == [7] * 4


def test_sort_memory_rejects_bad_rows():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sort_memory.py"), "--rows", "8,x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--rows: expected comma-separated integers" in proc.stderr


def test_multi_rank_bench_runs_under_torchrun(tmp_path):
    """Two gloo ranks, tiny shapes: every rank makes the same calls, rank 0 writes the rows with the model's."""
    out = tmp_path / "multi.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(ROOT / "bench" / "multi_rank.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TRITON_INTERPRET="1"),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [(r["tp"], r["num_reqs"], r["rows"]) for r in result["rows"]] == [(2, 8, 1), (2, 8, 2)]
    for row in result["rows"]:
        assert row["production"]["median"] > 0 and row["replicated"]["median"] > 0
        assert row["model"]["production"] > 0 and row["production"]["x_model"] > 0
    assert "replicated us" in proc.stdout


def test_multi_rank_bench_outside_torchrun_says_how_to_run_it():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "multi_rank.py"), "--quick"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "run it under torchrun" in proc.stderr


VLLM_033_FILE = vllm_files.batch_shard_file("0.33.0")  # from its wheel or a copy (tests/vllm_files.py)


@vllm_files.needs("0.33.0")
def test_the_bench_times_vllm_0_33_on_the_batches_its_engine_sends(tmp_path):
    """vLLM 0.33's file always reads seq_lens_cpu_upper_bound: the bench's batches carry it, as its
    model runner's do, so the file is timed instead of failing on the first row."""
    _, result = _quick_bench(tmp_path, VLLM_033_FILE)
    rows = result["rows"]
    assert rows and all(row["upstream.step"]["wall_us"] > 0 for row in rows)


def _bench(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_step.py"), "--quick", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TRITON_INTERPRET="1"),
        cwd=tmp_path,
    )


def test_the_bench_passes_the_owner_table_its_profile_needs(tmp_path):
    """Under owner rule owner_table every shard takes an owner table (without one production refuses the
    step, PRE-OWNER-TABLE): the run completing is that check; the JSON names the profile."""
    out = tmp_path / "bench.json"
    proc = _bench(tmp_path, "--profile", "vllm-0.34-sharded-draft-cache", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["settings"]["profile"] == "vllm-0.34-sharded-draft-cache"
    assert all(row["production.step"]["wall_us"] > 0 for row in result["rows"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--profile", "vllm-0.99"], "--profile vllm-0.99: no bundled profile of that name"),
        (
            ["--profile", "vllm-0.34-sharded-draft-cache", "--upstream", str(STAND_IN)],
            "the adapter of vLLM's file passes no owner table",
        ),
    ],
)
def test_a_profile_the_bench_cannot_time_is_named(tmp_path, args, message):
    proc = _bench(tmp_path, *args)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
