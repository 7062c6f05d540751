"""The step at deployment scale: production beside vLLM's file, against floors, and against the replicated baseline.

Rank 0 of a simulated tensor-parallel group on one device (``LoopbackComm``), rank 0 being the
most loaded rank (``scale_shapes.balanced_slots``). Three parts, one JSON:

* ``step``: per shape (vocab, logits dtype, requests, rows per request, tp) the production step
  (shard + all-to-all + gather with 20 logprobs and NaN counts) and, with ``--upstream FILE``,
  vLLM's file, timed in alternating bursts (A B, B A, ...); medians with quartiles, each beside its
  floor (``floors.py``: launch floor + must-move bytes at the measured copy rate) and the per-round
  ratio production / vLLM.
* ``baseline``: all-gather the full logits and sample every row on every rank (replicated) against
  shard + all-to-all + sample the local rows + gather (sharded), greedy and two top-p torch samplers
  (``samplers.py``: sorting, and sort-free); time per step, alternating, and peak device memory per step (allocations
  above the step's inputs, plus whatever the sharded path keeps between steps), beside 1/tp of the
  replicated peak and the sampler's own peak at both row counts.
* ``focus``: the host-bound shape (tp 8, 1024 requests, 1 row, vocab 32768, float32) with many more
  rounds, and production's step replayed from a CUDA graph beside it.

    python bench/scale_grid.py [--quick | --full | --large] [--upstream FILE] [--out results.json] [--plots DIR]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_step import (  # noqa: E402
    add_upstream,
    bench_device,
    captured,
    environment,
    save_json,
    synchronize,
    warm_up_device,
)
from floors import floor_us, measure_floors, step_bytes  # noqa: E402
from samplers import SAMPLERS, temporaries_bytes  # noqa: E402
from scale_shapes import (  # noqa: E402
    DTYPES,
    ScaleShape,
    allocated,
    implementations,
    interleave,
    peak_step_bytes,
    ratio_spread,
    spread,
)

VOCABS = [32768, 128256, 151936, 262144]


@dataclass
class Grid:
    vocab: list = field(default_factory=lambda: list(VOCABS))
    dtype: list = field(default_factory=lambda: ["bfloat16", "float32"])
    num_reqs: list = field(default_factory=lambda: [1, 64, 1024, 4096])
    rows: list = field(default_factory=lambda: [1, 4])
    tp: list = field(default_factory=lambda: [2, 8])
    baseline_vocab: list = field(default_factory=lambda: [151936])
    baseline_dtype: list = field(default_factory=lambda: ["bfloat16"])
    baseline_num_reqs: list = field(default_factory=lambda: [1, 16, 256, 1024, 4096])
    baseline_rows: list = field(default_factory=lambda: [1, 4])
    baseline_tp: list = field(default_factory=lambda: [2, 8])
    max_num_reqs: int = 4096
    max_rows: int = 8
    num_logprobs: int = 20
    rounds: int = 5
    focus_rounds: int = 30
    burst_s: float = 0.02
    memory_budget: float = 100e9  # bytes a shape may need before it is skipped (with its estimate)


GRIDS = {
    "default": Grid(),
    "full": Grid(
        num_reqs=[1, 4, 16, 64, 256, 1024, 2048, 4096],
        rows=[1, 4, 8],
        tp=[2, 4, 8],
        baseline_vocab=list(VOCABS),
        baseline_dtype=["bfloat16", "float32"],
        baseline_num_reqs=[1, 4, 16, 64, 256, 1024, 2048, 4096],
        baseline_rows=[1, 4, 8],
        baseline_tp=[2, 4, 8],
        rounds=7,
    ),
    # The GPU-bound corner: the shapes that move the most logits and fit one 80 GB card (about 35 GB at most).
    "large": Grid(vocab=[151936], num_reqs=[1024, 4096], rows=[4]),
    "quick": Grid(
        vocab=[256],
        num_reqs=[1, 8],
        rows=[2],
        tp=[2],
        baseline_vocab=[256],
        baseline_num_reqs=[8],
        baseline_rows=[2],
        baseline_tp=[2],
        max_num_reqs=16,
        max_rows=2,
        num_logprobs=2,
        rounds=2,
        focus_rounds=2,
        burst_s=0.0,
    ),
}
FOCUS = {"tp": 8, "num_reqs": 1024, "rows": 1, "vocab": 32768, "dtype": "float32"}
QUICK_FOCUS = {"tp": 2, "num_reqs": 8, "rows": 1, "vocab": 256, "dtype": "float32"}


def make_shape(grid, device, tp, num_reqs, rows, vocab, dtype, comm=None) -> ScaleShape:
    """The shape at ``grid``'s capacity and logprobs; ``comm``: a real group's (rank 0 of a simulated one if None)."""
    return ScaleShape(
        num_reqs,
        rows,
        tp,
        vocab,
        dtype,
        capacity=(grid.max_num_reqs, grid.max_rows),
        num_logprobs=grid.num_logprobs,
        device=device,
        comm=comm,
    )


def release(device) -> None:
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.empty_cache()


def step_row(grid: Grid, device, floors: dict, tp, num_reqs, rows, vocab, dtype) -> dict:
    row = {"tp": tp, "num_reqs": num_reqs, "rows": rows, "vocab": vocab, "dtype": dtype}
    itemsize = DTYPES[dtype].itemsize
    num_logits, local_bound = num_reqs * rows, -(-num_reqs // tp) * rows
    estimate = (num_logits * vocab // tp + 6 * local_bound * vocab) * itemsize
    if estimate > grid.memory_budget:
        return {**row, "skipped": f"needs about {estimate / 1e9:.0f} GB"}
    shape = make_shape(grid, device, tp, num_reqs, rows, vocab, dtype)
    row["bytes"] = step_bytes(num_logits, shape.num_local_logits, vocab, tp, itemsize)
    row["num_local_logits"] = shape.num_local_logits
    row["floor_us"] = floor_us(row["bytes"]["must_move"], floors)
    times = interleave({impl: shape.step_call(impl) for impl in implementations()}, device, grid.rounds, grid.burst_s)
    for impl, values in times.items():
        row[impl] = spread(values)
        row[impl]["x_floor"] = row[impl]["median"] / row["floor_us"]
    if "upstream" in times:
        row["production_over_upstream"] = ratio_spread(times["production"], times["upstream"])
    del shape
    release(device)
    return row


def baseline_rows(grid: Grid, device, tp, num_reqs, rows, vocab, dtype) -> list[dict]:
    """Replicated against sharded, greedy and top-p, for one shape."""
    itemsize = DTYPES[dtype].itemsize
    num_logits = num_reqs * rows
    shape = make_shape(grid, device, tp, num_reqs, rows, vocab, dtype)
    out = []
    for name, sampler in SAMPLERS.items():
        row = {
            "tp": tp,
            "num_reqs": num_reqs,
            "rows": rows,
            "vocab": vocab,
            "dtype": dtype,
            "sampler": name,
            "num_local_logits": shape.num_local_logits,
        }
        estimate = num_logits * vocab * 2 * itemsize + temporaries_bytes(name, num_logits, vocab)
        if estimate > grid.memory_budget:
            out.append({**row, "skipped": f"replicated needs about {estimate / 1e9:.0f} GB"})
            continue
        try:
            row.update(_baseline_pair(grid, device, shape, sampler))
        except torch.OutOfMemoryError as error:
            row["skipped"] = f"out of memory: {str(error).splitlines()[0]}"
        release(device)
        out.append(row)
    del shape
    release(device)
    return out


def _baseline_pair(grid: Grid, device, shape: ScaleShape, sampler) -> dict:
    before = allocated(device)
    sharded = shape.sharded_sampling_step(sampler)
    sharded()
    # Everything the sharded path still holds after a step: the sharder (workspace, cached views, and any
    # buffer it keeps between calls) and the step's small per-request constants.
    persistent = allocated(device) - before
    calls = {"replicated": shape.replicated_sampling_step(sampler), "sharded": sharded}
    memory = {
        "replicated": peak_step_bytes(calls["replicated"], device),
        "sharded": peak_step_bytes(sharded, device) + persistent,
    }
    times = interleave(calls, device, grid.rounds, grid.burst_s)
    row = {name: {**spread(values), "peak_bytes": memory[name]} for name, values in times.items()}
    row["sharded_persistent_bytes"] = persistent
    row["sharded_over_replicated"] = ratio_spread(times["sharded"], times["replicated"])
    if memory["replicated"]:
        row["memory_ratio"] = memory["sharded"] / memory["replicated"]
        row["memory"] = memory_split(shape, sampler, memory, device)
    return row


def memory_split(shape: ScaleShape, sampler, memory: dict, device) -> dict:
    """The sharded peak against 1/tp of the replicated one, and how much of each is the sampler alone.

    ``excess_bytes`` = sharded peak - replicated peak / tp (the done-when's bound is O(requests)). The
    sampler's own peak over a fresh [rows, V] input (its temporaries), for L_local and for L rows, separates
    what the sampler does at two row counts from what the step around it adds.
    """
    tp_share = memory["replicated"] / shape.tp
    alone = {
        "sharded": sampler_peak_bytes(sampler, shape.num_local_logits, shape.vocab, shape.dtype, device),
        "replicated": sampler_peak_bytes(sampler, shape.num_logits, shape.vocab, shape.dtype, device),
    }
    return {
        "tp_share_bytes": tp_share,
        "excess_bytes": memory["sharded"] - tp_share,
        "sampler_alone_bytes": alone,
        # What the step adds around the sampler: the exchange's buffers, the gather, the persistent bytes.
        "around_sampler_bytes": {name: memory[name] - alone[name] for name in memory},
    }


def sampler_peak_bytes(sampler, rows: int, vocab: int, dtype, device) -> int:
    """Peak bytes of ``sampler`` over one [rows, vocab] input allocated before it (CUDA only, else 0)."""
    if device.type != "cuda" or rows == 0:
        return 0
    logits = torch.randn(rows, vocab, device=device, dtype=dtype)
    peak = peak_step_bytes(functools.partial(sampler, logits), device)
    del logits
    release(device)
    return peak


def focus(grid: Grid, device, shape_args: dict) -> dict:
    """The host-bound shape: many alternating rounds, and the production step replayed from a CUDA graph."""
    shape = make_shape(
        grid,
        device,
        shape_args["tp"],
        shape_args["num_reqs"],
        shape_args["rows"],
        shape_args["vocab"],
        shape_args["dtype"],
    )
    calls = {impl: shape.step_call(impl) for impl in implementations()}
    if device.type == "cuda":
        calls["production_graph"] = captured_step(shape)
    times = interleave(calls, device, grid.focus_rounds, max(grid.burst_s, 0.01 if device.type == "cuda" else 0))
    result = {**shape_args, **{name: spread(values) for name, values in times.items()}}
    if "upstream" in times:
        result["production_over_upstream"] = ratio_spread(times["production"], times["upstream"])
        if "production_graph" in times:
            result["graph_over_upstream"] = ratio_spread(times["production_graph"], times["upstream"])
    return result


def captured_step(shape: ScaleShape):
    """The production step captured once (fixed shapes and split sizes): its replay."""
    return captured(shape.step_call("production")).replay


def run(grid: Grid, device, parts: set, focus_shape: dict, progress=print, checkpoint=lambda result: None) -> dict:
    """Every part of the grid; ``checkpoint(result)`` after each row, so that a run cut short keeps its rows."""
    result = {"environment": environment(device), "grid": asdict(grid), "implementations": implementations()}
    result["floors"] = measure_floors(device)
    progress(
        f"floors: launch {result['floors']['launch']['wall_us']:.1f} us wall, "
        f"copy {result['floors']['copy']['bytes_per_s'] / 1e12:.2f} TB/s"
    )
    if "focus" in parts:
        result["focus"] = focus(grid, device, focus_shape)
        progress(f"focus: {format_focus(result['focus'])}")
    if "step" in parts:
        result["step"] = []
        for tp in grid.tp:
            for vocab in grid.vocab:
                for dtype in grid.dtype:
                    for rows in grid.rows:
                        for num_reqs in grid.num_reqs:
                            row = step_row(grid, device, result["floors"], tp, num_reqs, rows, vocab, dtype)
                            result["step"].append(row)
                            progress(format_step_row(row))
                            checkpoint(result)
    if "baseline" in parts:
        result["baseline"] = []
        for tp in grid.baseline_tp:
            for vocab in grid.baseline_vocab:
                for dtype in grid.baseline_dtype:
                    for rows in grid.baseline_rows:
                        for num_reqs in grid.baseline_num_reqs:
                            for row in baseline_rows(grid, device, tp, num_reqs, rows, vocab, dtype):
                                result["baseline"].append(row)
                                progress(format_baseline_row(row))
                            checkpoint(result)
    result["floors_after"] = measure_floors(device)  # the machine may drift within a run
    return result


def _shape(row: dict) -> str:
    return f"{row['tp']:>2} {row['num_reqs']:>5} {row['rows']:>2} {row['vocab']:>6} {row['dtype'][:4]:>4}"


STEP_HEADER = (
    " tp  reqs  n  vocab  dt | MB/rank | floor us | prod us (q1-q3)         x floor"
    " | vLLM us (q1-q3)         x floor | prod/vLLM (q1-q3)"
)


def format_step_row(row: dict) -> str:
    if "skipped" in row:
        return f"{_shape(row)} | skipped: {row['skipped']}"
    cells = [f"{row['bytes']['logits_per_rank'] / 1e6:7.1f}", f"{row['floor_us']:8.1f}"]
    for impl in ("production", "upstream"):
        if impl in row:
            s = row[impl]
            cells.append(f"{s['median']:8.1f} ({s['q1']:7.1f}-{s['q3']:7.1f}) {s['x_floor']:6.2f}x")
    if "production_over_upstream" in row:
        r = row["production_over_upstream"]
        cells.append(f"{r['median']:5.2f} ({r['q1']:.2f}-{r['q3']:.2f})")
    return f"{_shape(row)} | " + " | ".join(cells)


BASELINE_HEADER = (
    " tp  reqs  n  vocab  dt | sampler         | replicated us   GB | sharded us   GB  (persistent GB)"
    " | time shard/repl (q1-q3) | memory shard/repl | over repl/tp MB | sampler alone GB L_local / L"
)


def format_baseline_row(row: dict) -> str:
    head = f"{_shape(row)} | {row['sampler']:<15}"
    if "skipped" in row:
        return f"{head} | skipped: {row['skipped']}"
    rep, sh, r = row["replicated"], row["sharded"], row["sharded_over_replicated"]
    memory = f"{row['memory_ratio']:.3f}" if "memory_ratio" in row else "-"
    split = ""
    if "memory" in row:
        m = row["memory"]
        alone = m["sampler_alone_bytes"]
        split = f" | {m['excess_bytes'] / 1e6:15.1f} | {alone['sharded'] / 1e9:7.3f} / {alone['replicated'] / 1e9:.3f}"
    return (
        f"{head} | {rep['median']:10.1f} {rep['peak_bytes'] / 1e9:6.2f} | {sh['median']:10.1f} "
        f"{sh['peak_bytes'] / 1e9:5.2f} ({row['sharded_persistent_bytes'] / 1e9:5.2f}) | "
        f"{r['median']:6.3f} ({r['q1']:.3f}-{r['q3']:.3f}) | {memory:>17}{split}"
    )


def format_focus(row: dict) -> str:
    cells = [
        f"{name} {row[name]['median']:.1f} us ({row[name]['q1']:.1f}-{row[name]['q3']:.1f})"
        for name in ("production", "upstream", "production_graph")
        if name in row
    ]
    for key in ("production_over_upstream", "graph_over_upstream"):
        if key in row:
            cells.append(f"{key} {row[key]['median']:.3f} ({row[key]['q1']:.3f}-{row[key]['q3']:.3f})")
    return "; ".join(cells)


def format_report(result: dict) -> str:
    env, floors = result["environment"], result["floors"]
    lines = [
        f"device {env['device_name']}, torch {env['torch']}, triton {env['triton']}, commit {env['commit']}",
        f"floors (start / end of run): empty launch {floors['launch']['wall_us']:.2f} / "
        f"{result['floors_after']['launch']['wall_us']:.2f} us wall, "
        f"{floors['launch']['gpu_us'] or 0:.2f} us GPU; copy {floors['copy']['bytes_per_s'] / 1e12:.2f} / "
        f"{result['floors_after']['copy']['bytes_per_s'] / 1e12:.2f} TB/s (read + write)",
    ]
    if "focus" in result:
        lines += [
            "",
            "host-bound shape (tp/reqs/rows/vocab/dtype "
            + "/".join(str(result["focus"][k]) for k in ("tp", "num_reqs", "rows", "vocab", "dtype"))
            + "): "
            + format_focus(result["focus"]),
        ]
    if result.get("step"):
        lines += ["", "step: wall us per call, median of rounds (quartiles); x floor = median / floor", STEP_HEADER]
        lines += [format_step_row(row) for row in result["step"]]
    if result.get("baseline"):
        lines += [
            "",
            "replicated (all-gather + sample all rows) vs sharded (shard + all-to-all + sample local rows"
            " + gather): wall us, peak GB per step",
            BASELINE_HEADER,
        ]
        lines += [format_baseline_row(row) for row in result["baseline"]]
    return "\n".join(lines)


def _write(path: str, result: dict) -> None:
    """The result so far, replaced whole (never a half-written file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".partial", "w") as handle:
        json.dump(result, handle, indent=1)
    os.replace(path + ".partial", path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="tiny shapes, a few seconds (smoke test, CPU)")
    size.add_argument("--full", action="store_true", help="the whole deployment grid (long)")
    size.add_argument("--large", action="store_true", help="only the GPU-bound shapes (vocab 151936, 4 rows)")
    parser.add_argument("--parts", default="focus,step,baseline", help="comma-separated: focus, step, baseline")
    parser.add_argument("--upstream", metavar="FILE", help="also time vLLM's batch_shard.py at this path")
    parser.add_argument("--out", help="write the results as JSON to this path")
    parser.add_argument("--plots", metavar="DIR", help="write PNG plots of the results to DIR (needs matplotlib)")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    if parts - {"focus", "step", "baseline"}:
        parser.error(f"--parts: unknown part(s) {sorted(parts - {'focus', 'step', 'baseline'})}")
    if args.upstream is not None:
        add_upstream(args.upstream)
    grid = GRIDS["quick" if args.quick else "full" if args.full else "large" if args.large else "default"]
    device = bench_device()
    warm_up_device(device)
    started = time.perf_counter()
    result = run(
        grid,
        device,
        parts,
        QUICK_FOCUS if args.quick else FOCUS,
        progress=lambda s: print(s, flush=True),
        checkpoint=(lambda partial: _write(args.out, partial)) if args.out else (lambda partial: None),
    )
    result["seconds"] = time.perf_counter() - started
    result["command"] = " ".join(["python", "bench/scale_grid.py", *(argv if argv is not None else sys.argv[1:])])
    print("\n" + format_report(result))
    if args.out:
        save_json(args.out, result)
    if args.plots:
        from plots import write_plots

        for path in write_plots(result, args.plots):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
