"""Where a production step spends its host time: cProfile over many steps, and each launch alone.

    python bench/profile_step.py [--num-reqs 1024] [--logits-per-req 1] [--tp 8]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_step import Bench, parse_args, synchronize  # noqa: E402


def per_call_us(fn, device, iters: int) -> float:
    for _ in range(min(20, iters)):
        fn()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / iters * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-reqs", type=int, default=1024)
    parser.add_argument("--logits-per-req", type=int, default=1)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2000, help="profiled steps")
    parser.add_argument("--iters", type=int, default=2000, help="calls per timed part")
    own = parser.parse_args(argv)
    args = parse_args([])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bench = Bench(args, own.num_reqs, own.logits_per_req, own.tp, device)
    sharder = bench.sharder("production")
    calls = bench.calls(sharder)
    shard = sharder.shard_sampler_inputs(bench.batch, None)
    parts = {
        "plan kernel launch": lambda: sharder._launch_plan(bench.batch, bench.batch.num_reqs,
                                                          shard.metadata.max_num_reqs_per_rank),
        "all_to_all_logits": lambda: sharder.all_to_all_logits(bench.logits_shard, shard.metadata),
        **calls,
    }
    for name, fn in parts.items():
        print(f"{name:>20}: {per_call_us(fn, device, own.iters):8.1f} us wall per call", flush=True)
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
