"""The captured step (shardspec_cuda_graph.py) beside production's eager step and vLLM's file, interleaved.

Rank 0 of a simulated group on one GPU (``LoopbackComm``; rank 0 the most loaded rank, as in
``scale_grid.py``). Per shape, in alternating bursts (A B C D, then D C B A, ...), wall time per
call of:

* ``upstream``: vLLM's file, eager (``--upstream FILE``);
* ``production``: production's eager step (shard + all-to-all + gather with 20 logprobs and NaN counts);
* ``captured``: ``CapturedSteps.step``: the host's checks and counts, the batch copied into the
  bucket's static buffers, three graph replays (shard, exchange, gather) and the trimmed views;
  the engine's logits and sampler output already in the static buffers (as an LM head and a
  sampler writing there would leave them);
* ``captured_copies``: the same, with the padded logits and the sampler output passed as tensors
  of their own, so copied into the static buffers each step (and the sampler output checked);
* ``replays_only``: the three graph replays alone, nothing staged or checked: the device time the
  captured step cannot go below.

Ratios are per round against ``upstream`` (median and quartiles of per-round ratios). Before
timing, each shape's captured results are compared with production's eager ones (local logits
rows, every gathered field). Also printed: the bucket and the bytes of the padded wire against the
spec's unpadded one (``shardspec_cuda_graph.wire_bytes``).

    python3 examples/cuda_graph_step/bench_cuda_graph_step.py --upstream FILE [--rounds 30] [--out R.json] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# bench_step and scale_shapes live in bench/; this folder holds shardspec_cuda_graph.
sys.path[:0] = [os.path.join(HERE, "..", "..", "bench"), HERE]
from bench_step import (  # noqa: E402
    IMPLS,
    UPSTREAM,
    add_upstream,
    bench_device,
    environment,
    save_json,
    synchronize,
    warm_up_device,
)
from scale_shapes import ScaleShape, interleave, ratio_spread, spread  # noqa: E402
from shardspec_cuda_graph import CapturedSteps, wire_bytes  # noqa: E402

from shardspec.comm import LoopbackComm  # noqa: E402

# (tp, requests, rows per request, vocab, dtype, rounds): the host-bound shape first, then bucket padding.
SHAPES = [
    (8, 1024, 1, 32768, "float32", 30),
    (8, 600, 1, 32768, "float32", 15),
    (8, 300, 1, 32768, "float32", 15),
    (8, 1024, 4, 32768, "float32", 15),
    (8, 700, 3, 32768, "float32", 15),
    (2, 1024, 1, 32768, "float32", 15),
]
QUICK = [(2, 8, 2, 256, "float32", 2)]
CAPACITY, NUM_LOGPROBS = (4096, 8), 20


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", metavar="FILE", help="vLLM's batch_shard.py")
    parser.add_argument("--rounds", type=int, help="rounds per shape (default: per shape, 30 or 15)")
    parser.add_argument("--burst-s", type=float, default=0.02)
    parser.add_argument("--out", help="write the results as JSON to this path")
    parser.add_argument("--quick", action="store_true", help="one tiny shape, two rounds (smoke test)")
    return parser.parse_args(argv)


def padded_copy(logits_shard: torch.Tensor, plan) -> torch.Tensor:
    """The owner-sorted ``[L, V/tp]`` rows laid out on the padded wire (``[tp * R, V/tp]``, zero padding)."""
    rows = plan.bucket.rows_per_rank
    padded = logits_shard.new_zeros((len(plan.num_logits_per_rank) * rows, logits_shard.shape[1]))
    start = 0
    for r, count in enumerate(plan.num_logits_per_rank):
        padded[r * rows : r * rows + count] = logits_shard[start : start + count]
        start += count
    return padded


def check_equal(shape: ScaleShape, steps: CapturedSteps, padded: torch.Tensor) -> bool:
    """Captured against eager production: local logits rows and every gathered field."""
    sharder = shape.sharder("production")
    shard = sharder.shard_sampler_inputs(shape.batch, None)
    out = shape.local_output(shard.local_batch)
    local = sharder.all_to_all_logits(shape.logits_shard, shard.metadata).clone()
    gathered = sharder.gather_sampler_output(
        out, shard.metadata, shape.batch, shard.local_batch, gather_num_nans=True, logprobs_dims=shape.dims
    )
    plan, c_local, c_gathered = steps.step(shape.batch, padded, out)
    synchronize(shape.device)
    same = torch.equal(local, c_local)
    for name in ("sampled_token_ids", "num_sampled", "num_rejected", "num_nans"):
        same &= torch.equal(getattr(gathered, name), getattr(c_gathered, name))
    for e, a in zip(gathered.logprobs_tensors, c_gathered.logprobs_tensors, strict=True):
        same &= torch.equal(e, a) if isinstance(e, torch.Tensor) else e == a
    return bool(same)


def measure_shape(tp, num_reqs, rows, vocab, dtype, rounds, burst_s, device) -> dict:
    shape = ScaleShape(num_reqs, rows, tp, vocab, dtype, capacity=CAPACITY, num_logprobs=NUM_LOGPROBS, device=device)
    steps = CapturedSteps(
        *CAPACITY,
        comm=LoopbackComm(0, tp),
        vocab=vocab,
        logits_dtype=shape.dtype,
        device=device,
        gather_num_nans=True,
        logprobs_dims=shape.dims,
    )
    plan = steps.shard(shape.batch)
    padded = padded_copy(shape.logits_shard, plan)
    equal = check_equal(shape, steps, padded)  # also leaves the logits and the sampler output in place
    out = shape.local_output(plan.local_batch)
    calls = {name: shape.step_call(name) for name in (UPSTREAM, "production") if name in IMPLS}
    calls["captured"] = lambda: steps.step(shape.batch)
    calls["captured_copies"] = lambda: steps.step(shape.batch, padded, out)
    graphs = plan._entry.graphs
    if graphs is not None:  # the three replays alone, nothing staged: the captured step's device time
        calls["replays_only"] = lambda: [graph.replay() for graph in graphs]
    times = interleave(calls, device, rounds, burst_s)
    bytes_ = wire_bytes(
        plan.num_logits_per_rank,
        plan.num_reqs_per_rank,
        plan.width,
        plan.bucket,
        vocab=vocab,
        itemsize=shape.logits_shard.element_size(),
        num_logprobs=NUM_LOGPROBS,
    )
    result = {
        "tp": tp,
        "num_reqs": num_reqs,
        "rows": rows,
        "vocab": vocab,
        "dtype": dtype,
        "rounds": rounds,
        "bucket": [plan.bucket.reqs_per_rank, plan.bucket.rows_per_req],
        "reqs_per_rank_max": max(plan.num_reqs_per_rank),
        "equal_to_eager": equal,
        "wire_bytes": bytes_,
        **{name: spread(values) for name, values in times.items()},
    }
    if UPSTREAM in times:
        for name in times:
            if name != UPSTREAM:
                result[f"{name}_over_upstream"] = ratio_spread(times[name], times[UPSTREAM])
    return result


def format_row(row: dict) -> str:
    b = row["wire_bytes"]
    head = (
        f"tp {row['tp']} {row['num_reqs']:>5} x {row['rows']} {row['vocab']} {row['dtype'][:4]} "
        f"bucket {row['bucket'][0]}x{row['bucket'][1]} (max reqs/rank {row['reqs_per_rank_max']}) "
        f"equal {row['equal_to_eager']}"
    )
    times = " | ".join(
        f"{name} {row[name]['median']:.1f} us ({row[name]['q1']:.1f}-{row[name]['q3']:.1f})"
        for name in ("upstream", "production", "captured", "captured_copies", "replays_only")
        if name in row
    )
    ratios = " | ".join(
        f"{name}/vLLM {row[f'{name}_over_upstream']['median']:.3f} "
        f"({row[f'{name}_over_upstream']['q1']:.3f}-{row[f'{name}_over_upstream']['q3']:.3f})"
        for name in ("production", "captured", "captured_copies", "replays_only")
        if f"{name}_over_upstream" in row
    )
    wire = (
        f"a2a send per rank {b['a2a_send_unpadded'] / 1e6:.2f} -> {b['a2a_send_padded'] / 1e6:.2f} MB "
        f"(x{b['a2a_send_padded'] / max(1, b['a2a_send_unpadded']):.2f}), receive "
        f"{b['a2a_receive_unpadded'] / 1e6:.2f} -> {b['a2a_receive_padded'] / 1e6:.2f} MB, gathers received "
        f"{b['gather_receive_unpadded'] / 1e6:.3f} -> {b['gather_receive_padded'] / 1e6:.3f} MB"
    )
    return f"{head}\n  {times}\n  {ratios}\n  wire: {wire}"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.upstream:
        add_upstream(args.upstream)
    device = bench_device()
    warm_up_device(device)
    env = environment(device)
    name = env.get("device_name", device)
    print(f"device {name}, torch {env['torch']}, triton {env['triton']}, commit {env.get('commit')}")
    rows = []
    for tp, num_reqs, rows_per_req, vocab, dtype, rounds in QUICK if args.quick else SHAPES:
        burst = 0.0 if args.quick else args.burst_s
        row = measure_shape(tp, num_reqs, rows_per_req, vocab, dtype, args.rounds or rounds, burst, device)
        rows.append(row)
        print(format_row(row), flush=True)
    if args.out:
        save_json(args.out, {"environment": env, "rows": rows})
    return 0 if all(row["equal_to_eager"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
