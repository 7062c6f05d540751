"""The step on a real process group, beside the NVLink model: run under torchrun, one process per rank.

    torchrun --nproc-per-node 8 bench/multi_rank.py [--quick] [--upstream FILE] [--out multi.json]

Every rank builds the same batch (request i owned by rank i % tp, as ``scale_grid.py``'s shapes) and
its own vocab shard of the logits, then times, alternating burst by burst:

* ``production``: its step (shard, all-to-all, gather with 20 logprobs and NaN counts; the sampler's
  output is fixed, as in ``bench_step.py``), and ``upstream``, vLLM's file, with ``--upstream``;
* ``replicated``: what every other engine does instead, the all-gather of the full logits and the
  [L, V] copy (no sampling: the model below leaves sampling out too).

A burst counts as long as its slowest rank's; medians and quartiles over rounds. Rank 0 prints each
median beside ``nvlink_model.py``'s prediction for this tp at the copy rate measured here, and the
peak device memory per step (the largest over ranks). On CPUs (gloo) the same code is a smoke test.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_step import add_upstream, bench_device, environment, save_json, warm_up_device  # noqa: E402
from floors import copy_bandwidth  # noqa: E402
from nvlink_model import model  # noqa: E402
from scale_grid import make_shape  # noqa: E402
from scale_shapes import DTYPES, implementations, interleave, peak_step_bytes, spread  # noqa: E402

from shardspec.comm import TorchDistComm  # noqa: E402


@dataclass
class Grid:
    vocab: list = field(default_factory=lambda: [32768, 151936])
    dtype: list = field(default_factory=lambda: ["bfloat16"])
    num_reqs: list = field(default_factory=lambda: [64, 1024, 4096])
    rows: list = field(default_factory=lambda: [1, 4])
    max_num_reqs: int = 4096
    max_rows: int = 8
    num_logprobs: int = 20
    rounds: int = 7
    burst_s: float = 0.02


QUICK = Grid(vocab=[256], dtype=["float32"], num_reqs=[8], rows=[1, 2], max_num_reqs=16, max_rows=2,
             num_logprobs=2, rounds=2, burst_s=0.0)  # fmt: skip


def no_sampler(logits: torch.Tensor) -> torch.Tensor:
    return logits


def group_max(value: float, device: torch.device) -> float:
    """The largest of every rank's ``value`` (each rank must call it, in the same order)."""
    on = device if dist.get_backend() == "nccl" else torch.device("cpu")
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=on)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def shape_row(grid: Grid, comm, device, copy_bytes_per_us: float, num_reqs, rows, vocab, dtype) -> dict:
    tp = comm.world_size
    row = {"tp": tp, "num_reqs": num_reqs, "rows": rows, "vocab": vocab, "dtype": dtype}
    shape = make_shape(grid, device, tp, num_reqs, rows, vocab, dtype, comm)
    calls = {impl: shape.step_call(impl) for impl in implementations()}
    calls["replicated"] = shape.replicated_sampling_step(no_sampler)
    agree = lambda value: group_max(value, device)  # noqa: E731
    for name, values in interleave(calls, device, grid.rounds, grid.burst_s, agree).items():
        row[name] = {**spread(values), "peak_bytes": int(agree(peak_step_bytes(calls[name], device)))}
    predicted = model(num_reqs, rows, vocab, DTYPES[dtype].itemsize, copy_bytes_per_us, tp=tp)
    row["model"] = {"production": predicted["sharded_us"], "replicated": predicted["replicated_us"]}
    for name in row["model"]:
        row[name]["x_model"] = row[name]["median"] / row["model"][name]
    return row


HEADER = (
    " tp  reqs  n  vocab  dt | production us (q1-q3)  model  x model  peak MB | replicated us (q1-q3)  model"
    "  x model  peak MB | vLLM us | repl / prod"
)


def format_row(row: dict) -> str:
    cells = [f"{row['tp']:>3} {row['num_reqs']:>5} {row['rows']:>2} {row['vocab']:>6} {row['dtype'][:4]:>4}"]
    for name in ("production", "replicated"):
        r = row[name]
        cells.append(
            f"{r['median']:9.1f} ({r['q1']:.1f}-{r['q3']:.1f}) {row['model'][name]:7.1f} {r['x_model']:6.2f}x "
            f"{r['peak_bytes'] / 1e6:8.1f}"
        )
    cells.append(f"{row['upstream']['median']:8.1f}" if "upstream" in row else "       -")
    cells.append(f"{row['replicated']['median'] / row['production']['median']:6.2f}")
    return " | ".join(cells)


def run(grid: Grid, comm, device, progress=print) -> dict:
    copy = copy_bandwidth(device)
    copy_bytes_per_us = group_max(-copy["bytes_per_s"], device) * -1e-6  # the slowest rank's rate
    result = {"environment": environment(device), "grid": asdict(grid), "tp": comm.world_size}
    result["copy_bytes_per_s"] = copy_bytes_per_us * 1e6
    result["rows"] = []
    progress(HEADER)
    for vocab in grid.vocab:
        for dtype in grid.dtype:
            for rows in grid.rows:
                for num_reqs in grid.num_reqs:
                    row = shape_row(grid, comm, device, copy_bytes_per_us, num_reqs, rows, vocab, dtype)
                    result["rows"].append(row)
                    progress(format_row(row))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, a few seconds (smoke test, CPU)")
    parser.add_argument("--upstream", metavar="FILE", help="also time vLLM's batch_shard.py at this path")
    parser.add_argument("--out", help="rank 0 writes the results as JSON to this path")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("run it under torchrun (one process per rank), e.g. torchrun --nproc-per-node 2 " + sys.argv[0])
    if args.upstream is not None:
        add_upstream(args.upstream)
    device = bench_device()
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    comm = TorchDistComm(dist.group.WORLD)
    grid = QUICK if args.quick else Grid()
    if grid.vocab and any(vocab % comm.world_size for vocab in grid.vocab):
        parser.error(f"every vocab must divide by the group size {comm.world_size}")
    warm_up_device(device)
    started = time.perf_counter()
    progress = print if comm.rank == 0 else (lambda line: None)
    result = run(grid, comm, device, lambda line: progress(line) or sys.stdout.flush())
    result["seconds"] = time.perf_counter() - started
    result["command"] = " ".join(["torchrun", f"--nproc-per-node {comm.world_size}", "bench/multi_rank.py",
                                  *(argv if argv is not None else sys.argv[1:])])  # fmt: skip
    if comm.rank == 0 and args.out:
        save_json(args.out, result)
    # Every rank leaves together: without this barrier, on a loaded CPU, a gloo rank that tore its group
    # down first aborted at exit ("terminate called without an active exception"): 2 of 5 runs, 0 of 12 with it.
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
