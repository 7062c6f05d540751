"""Where a production step spends its host time: each part alone, each part inside whole steps, cProfile.

A part timed alone repeats one call with warm caches; inside whole steps the same call runs
between the others, as an engine runs it, and usually costs more.

    python bench/profile_step.py [--num-reqs 1024] [--logits-per-req 1] [--tp 8] [--upstream FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_step import UPSTREAM, Bench, add_upstream, bench_device, burst_us, parse_args, synchronize  # noqa: E402


def per_call_us(fn, device, iters: int) -> float:
    for _ in range(min(20, iters)):  # warm-up
        fn()
    return burst_us(fn, device, iters)


def step_segments(sharder, bench, device, iters: int) -> dict:
    """Mean wall time of shard, all-to-all and gather inside consecutive whole steps."""
    shard = sharder.shard_sampler_inputs(bench.batch, None)
    local_output = bench.local_output(shard.local_batch)
    clock, totals = time.perf_counter, [0.0, 0.0, 0.0]
    for step in range(min(20, iters) + iters):
        start = clock()
        result = sharder.shard_sampler_inputs(bench.batch, None)
        sharded = clock()
        sharder.all_to_all_logits(bench.logits_shard, result.metadata)
        exchanged = clock()
        sharder.gather_sampler_output(
            local_output,
            result.metadata,
            bench.batch,
            result.local_batch,
            gather_num_nans=True,
            logprobs_dims=bench.dims,
        )
        gathered = clock()
        if step >= min(20, iters):  # the first steps warm up
            totals[0] += sharded - start
            totals[1] += exchanged - sharded
            totals[2] += gathered - exchanged
    synchronize(device)
    return {
        name: total / iters * 1e6 for name, total in zip(("shard", "all_to_all_logits", "gather"), totals, strict=False)
    }


def _plan_sizes(batch, metadata) -> tuple:
    """What the shard step passes to the plan kernel: requests, rows, and this rank's share, and the padding."""
    return (
        batch.num_reqs,
        batch.num_logits,
        metadata.num_local_reqs,
        metadata.num_local_logits,
        metadata.max_num_reqs_per_rank,
    )


def side_by_side(bench, device, iters: int, rounds: int = 8) -> int:
    """Each part's median wall time inside steps, production against vLLM's file, in alternating rounds."""
    sharders = {impl: bench.sharder(impl) for impl in ("production", UPSTREAM)}
    segments = {impl: [] for impl in sharders}
    for round_ in range(rounds):
        for impl in sharders if round_ % 2 == 0 else reversed(sharders):
            segments[impl].append(step_segments(sharders[impl], bench, device, iters // rounds))
    medians = {impl: {n: statistics.median(s[n] for s in runs) for n in runs[0]} for impl, runs in segments.items()}
    for name in medians["production"]:
        ours, theirs = medians["production"][name], medians[UPSTREAM][name]
        print(
            f"{name + ' in step':>26}: production {ours:7.1f} us, vLLM's file {theirs:7.1f} us ({ours / theirs:.2f}x)"
        )
    ours, theirs = sum(medians["production"].values()), sum(medians[UPSTREAM].values())
    print(f"{'sum':>26}: production {ours:7.1f} us, vLLM's file {theirs:7.1f} us ({ours / theirs:.2f}x)", flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-reqs", type=int, default=1024)
    parser.add_argument("--logits-per-req", type=int, default=1)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2000, help="profiled steps")
    parser.add_argument("--iters", type=int, default=2000, help="calls per timed part")
    parser.add_argument(
        "--upstream",
        metavar="FILE",
        help="instead: the parts inside steps of production and vLLM's file side by side, alternating rounds",
    )
    own = parser.parse_args(argv)
    args = parse_args([])
    device = bench_device()
    bench = Bench(args, own.num_reqs, own.logits_per_req, own.tp, device)
    if own.upstream:
        add_upstream(own.upstream)
        return side_by_side(bench, device, own.iters)
    sharder = bench.sharder("production")
    calls = bench.calls(sharder)
    shard = sharder.shard_sampler_inputs(bench.batch, None)
    parts = {
        "plan kernel launch": lambda: sharder._launch_plan(bench.batch, _plan_sizes(bench.batch, shard.metadata)),
        "all_to_all_logits": lambda: sharder.all_to_all_logits(bench.logits_shard, shard.metadata),
        **calls,
    }
    for name, fn in parts.items():
        print(f"{name:>26}: {per_call_us(fn, device, own.iters):8.1f} us wall per call", flush=True)
    for name, mean in step_segments(sharder, bench, device, own.iters).items():
        print(f"{name + ' in step':>26}: {mean:8.1f} us wall per call", flush=True)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(own.steps):
        calls["step"]()
    synchronize(device)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    print(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
