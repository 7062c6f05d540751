"""Two builds of the production sharder timed in alternation inside one process.

On shared GPU hosts the same code runs up to 2x slower from one process (or one
minute) to the next, so separate runs of two versions (tried first, see
bench/NOTES.md) cannot resolve differences of a few percent. Here both versions live in one
process: each is imported from its own install directory (``pip install
--target DIR TREE``), both get the same batches from this tree's benchmark
harness, and short timed bursts alternate between them (ABBA order), so slow
drift of the machine hits both alike. Reported per operation: each version's
median per-call wall time over the bursts, and the median of the per-round
ratios new / old with its interquartile range.

Either side may instead be ``upstream:FILE``: vLLM's own ``batch_shard.py``
through ``examples/upstream_vllm``, for a precise ratio to upstream. ``SITE@PROFILE`` builds that
side's sharder under a profile (its ``rules=`` argument, ``profile=`` in a build from before it; a build
without either follows its own rules).

    python bench/ab_inprocess.py OLD_SITE NEW_SITE [--tp 8] [--num-reqs 1024] [--logits-per-req 1]
    python bench/ab_inprocess.py OLD_SITE NEW_SITE@vllm-seed
    python bench/ab_inprocess.py upstream:FILE NEW_SITE
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_step import OPS, Bench, add_upstream, bench_device, burst_us, parse_args  # noqa: E402

from shardspec.comm import LoopbackComm  # noqa: E402
from shardspec.spec.profiles import rules_of  # noqa: E402


def sharder_class(site: str):
    """``ProductionSharder`` as installed in ``site``, imported beside any other shardspec."""
    for name in [name for name in sys.modules if name == "shardspec" or name.startswith("shardspec.")]:
        sys.modules[f"_ab_previous.{name}"] = sys.modules.pop(name)  # keep the harness's own copy alive
    sys.path.insert(0, site)
    try:
        module = importlib.import_module("shardspec.impl")
        if not os.path.abspath(module.__file__).startswith(os.path.abspath(site)):
            raise RuntimeError(f"{site} holds no shardspec (imported {module.__file__})")
        return module.ProductionSharder
    finally:
        sys.path.remove(site)
        for name in [name for name in sys.modules if name == "shardspec" or name.startswith("shardspec.")]:
            sys.modules.pop(name)
        for name in [name for name in sys.modules if name.startswith("_ab_previous.")]:
            sys.modules[name[len("_ab_previous.") :]] = sys.modules.pop(name)


def sharder_factory(side: str):
    """A site directory (its ``ProductionSharder``, under ``@PROFILE`` where named) or ``upstream:FILE``
    (vLLM's file, adapted)."""
    if side.startswith("upstream:"):
        return add_upstream(side[len("upstream:") :])
    site, _, profile = side.partition("@")
    if not profile:
        return sharder_class(site)
    sharder = sharder_class(site)
    # A build from before the sharders took a profile's rules takes its name.
    by_name = "rules" not in inspect.signature(sharder).parameters
    return functools.partial(sharder, **({"profile": profile} if by_name else {"rules": rules_of(profile)}))


def quartiles(values: list[float]) -> tuple[float, float, float]:
    low, median, high = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return low, median, high


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old_site")
    parser.add_argument("new_site")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--num-reqs", type=int, default=1024)
    parser.add_argument("--logits-per-req", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=100, help="calls per timed burst")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test, CPU)")
    own = parser.parse_args(argv)
    args = parse_args(["--quick"] if own.quick else [])
    device = bench_device()
    bench = Bench(args, own.num_reqs, own.logits_per_req, own.tp, device)
    sides = {}
    for side, site in (("old", own.old_site), ("new", own.new_site)):
        try:
            sharder = sharder_factory(site)(*bench.capacity, comm=LoopbackComm(0, own.tp), device=device)
        except (RuntimeError, ValueError) as exc:  # no shardspec there, or a profile it does not know
            print(f"ab_inprocess: {site}: {exc}", file=sys.stderr)
            return 2
        sides[side] = bench.calls(sharder)
    print(
        f"tp {own.tp}, {own.num_reqs} requests x {own.logits_per_req} rows, {own.rounds} rounds of "
        f"{own.calls} calls per side and operation; device {device}"
    )
    for op in OPS:
        times = {"old": [], "new": []}
        for side in ("old", "new"):
            burst_us(sides[side][op], device, own.calls)  # warm-up
        for round_ in range(own.rounds):
            order = ("old", "new") if round_ % 2 == 0 else ("new", "old")
            for side in order:
                times[side].append(burst_us(sides[side][op], device, own.calls))
        ratios = [new / old for old, new in zip(times["old"], times["new"], strict=False)]
        low, median, high = quartiles(ratios)
        print(
            f"{op:>7}: old {statistics.median(times['old']):8.1f} us, new {statistics.median(times['new']):8.1f} us"
            f" (medians); new/old per round: median {median:.3f}, quartiles {low:.3f}-{high:.3f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
