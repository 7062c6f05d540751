"""Per-step cost of the reference and the production sharder, side by side.

Rank 0 of a simulated tensor-parallel group on one device
(:class:`shardspec.comm.LoopbackComm`: every peer sends what rank 0 sends,
each collective costs one local copy). For each batch shape it times

* shard:  ``shard_sampler_inputs``
* gather: ``gather_sampler_output`` with NaN counts and logprobs
* step:   shard + ``all_to_all_logits`` + gather

Wall time comes from ``time.perf_counter`` over many calls after a warm-up,
GPU time from CUDA events around the same calls (both per call, median of
several repeats). ``--upstream FILE`` adds vLLM's own ``batch_shard.py`` (run
through ``examples/upstream_vllm``) as a third column, timed the same way. The
local sampler is not timed: a synthetic local output of the right shapes stands
in for it. ``--graph`` also times the production step
replayed from a captured CUDA graph (fixed shapes).

    python bench/bench_step.py [--out results.json] [--quick] [--graph] [--upstream FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from shardspec.comm import LoopbackComm  # noqa: E402
from shardspec.engine import engine_step  # noqa: E402
from shardspec.impl import ProductionSharder  # noqa: E402
from shardspec.reference import ReferenceSharder  # noqa: E402
from shardspec.spec.builders import build_input_batch  # noqa: E402
from shardspec.spec.model import LogprobsTensors, SamplerOutput, num_logprob_columns  # noqa: E402
from shardspec.spec.profiles import DEFAULT_PROFILE, PROFILES, rules_of  # noqa: E402

IMPLS = {"reference": ReferenceSharder, "production": ProductionSharder}
UPSTREAM = "upstream"
OPS = ("shard", "gather", "step")
# Production with its host-side precondition checks switched off: what the checks cost.
UNCHECKED = "production_unchecked"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write the results as JSON to this path")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few calls (smoke test, CPU)")
    parser.add_argument("--graph", action="store_true", help="also time the production step as a CUDA graph")
    parser.add_argument("--num-reqs", type=int, nargs="+", default=[16, 256, 1024])
    parser.add_argument("--logits-per-req", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--tp", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--max-num-reqs", type=int, default=1024, help="sharder capacity")
    parser.add_argument("--vocab", type=int, default=32768, help="padded vocab size (all ranks)")
    parser.add_argument("--num-logprobs", type=int, default=20)
    parser.add_argument("--target-s", type=float, default=0.2, help="time per measurement")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--upstream", metavar="FILE", help="also time vLLM's batch_shard.py at this path")
    parser.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help="the profile the sharders follow and the batches are built for (default %(default)s); under "
        "owner rule owner_table each step passes an owner table, which the --upstream adapter cannot",
    )
    args = parser.parse_args(argv)
    if args.profile not in PROFILES:
        parser.error(f"--profile {args.profile}: no bundled profile of that name ({', '.join(PROFILES)})")
    if args.quick:
        args.num_reqs, args.logits_per_req, args.tp = [4, 16], [1, 2], [2]
        args.max_num_reqs, args.vocab, args.num_logprobs = 32, 256, 2
        args.target_s, args.repeats = 0.0, 1
    return args


def engine_batch(slots, num_logits_per_req, device: torch.device):
    """A batch as vLLM's model runner builds it since 0.33: with seq_lens_cpu_upper_bound, which vLLM's
    own batch_shard.py always reads (without it, ``--upstream`` fails where the bench should time it)."""
    return build_input_batch(slots, num_logits_per_req, device=device, seq_lens_upper_bound=True)


class Bench:
    """One batch shape on one device: inputs, synthetic sampler output, and the timed calls."""

    def __init__(self, args, num_reqs: int, logits_per_req: int, tp: int, device: torch.device):
        rng = np.random.default_rng(num_reqs * 10 + logits_per_req + 1000 * tp)
        slots = rng.permutation(args.max_num_reqs)[:num_reqs]
        self.tp, self.device, self.profile = tp, device, args.profile
        self.batch = engine_batch(slots, [logits_per_req] * num_reqs, device)
        # Under owner rule owner_table: the owners earlier steps left in the engine's table (CL-OWNER-TABLE).
        by_table = rules_of(args.profile).owner_by_table
        self.shard_kwargs = {"owner_table": rng.integers(0, tp, args.max_num_reqs)} if by_table else {}
        self.dims = (args.num_logprobs, 0)
        self.capacity = (args.max_num_reqs, max(args.logits_per_req))
        num_logits = num_reqs * logits_per_req
        self.logits_shard = torch.randn(num_logits, args.vocab // tp, device=device)

    def sharder(self, impl: str, **options):
        if impl != UPSTREAM:  # the adapter of vLLM's file follows the file's own rules
            options = {"rules": rules_of(self.profile), **options}
        return IMPLS[impl](*self.capacity, comm=LoopbackComm(0, self.tp), device=self.device, **options)

    def local_output(self, local_batch) -> SamplerOutput:
        """What a sampler would return for ``local_batch``: right shapes, arbitrary values."""
        n, rows, width = local_batch.num_reqs, local_batch.num_logits, self.capacity[1]
        cols = num_logprob_columns(self.dims)
        gen = torch.Generator(device=self.device).manual_seed(0)
        ids = torch.randint(0, 1000, (n, width), device=self.device, generator=gen)
        return SamplerOutput(
            sampled_token_ids=ids,
            logprobs_tensors=LogprobsTensors(
                torch.randint(0, 1000, (rows, cols), device=self.device, generator=gen),
                torch.randn(rows, cols, device=self.device, generator=gen),
                torch.randint(0, 10, (rows,), device=self.device, generator=gen),
            ),
            num_nans=torch.zeros(rows, dtype=torch.int32, device=self.device),
            num_sampled=torch.ones(n, dtype=torch.int32, device=self.device),
            num_rejected=torch.zeros(n, dtype=torch.int32, device=self.device),
        )

    def calls(self, sharder) -> dict[str, Callable[[], object]]:
        shard_kwargs = self.shard_kwargs
        shard = sharder.shard_sampler_inputs(self.batch, None, **shard_kwargs)
        out = self.local_output(shard.local_batch)

        def gather(md=shard.metadata, local=shard.local_batch):
            return sharder.gather_sampler_output(
                out, md, self.batch, local, gather_num_nans=True, logprobs_dims=self.dims
            )

        gather_kwargs = {"gather_num_nans": True, "logprobs_dims": self.dims}

        def step():  # the engine's step; the sampler's output is fixed (the sampler is not timed)
            return engine_step(
                sharder,
                self.batch,
                None,
                lambda s: self.logits_shard,
                lambda f, s: out,
                gather_kwargs,
                shard_kwargs=shard_kwargs,
            )

        def shard_step():
            return sharder.shard_sampler_inputs(self.batch, None, **shard_kwargs)

        return {"shard": shard_step, "gather": gather, "step": step}


def bench_device() -> torch.device:
    """The GPU where there is one, else the CPU (where this module selected the Triton interpreter)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def burst_us(fn: Callable[[], object], device: torch.device, calls: int) -> float:
    """Wall microseconds per call of ``calls`` back-to-back calls, the device's queue drained at both ends."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / calls * 1e6


def measure(fn: Callable[[], object], device: torch.device, target_s: float, repeats: int) -> dict:
    """Per-call wall and GPU microseconds (median over repeats), after a warm-up of target_s / 2."""
    fn()
    warm_until = time.perf_counter() + target_s / 2
    while time.perf_counter() < warm_until:
        fn()
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    iters = int(min(2000, max(3, target_s / max(time.perf_counter() - start, 1e-6))))
    walls, gpus = [], []
    for _ in range(repeats):
        events = None
        if device.type == "cuda":
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            events[0].record()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        if events is not None:
            events[1].record()
        synchronize(device)
        walls.append((time.perf_counter() - start) / iters * 1e6)
        if events is not None:
            gpus.append(events[0].elapsed_time(events[1]) / iters * 1e3)
    return {
        "wall_us": statistics.median(walls),
        "gpu_us": statistics.median(gpus) if gpus else None,
        "iters": iters,
        "repeats": repeats,
    }


def warm_up_for_capture(step: Callable[[], object]) -> None:
    """A few calls of ``step`` on a side stream, as CUDA graph capture asks: the lazy work of the first calls
    (compiling, allocating) is done before the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)


def captured(step: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """``step`` captured once as a CUDA graph (its shapes and split sizes fixed), after the warm-up."""
    warm_up_for_capture(step)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def graph_replay_us(bench: Bench, target_s: float, repeats: int) -> float | None:
    """The production step captured once as a CUDA graph; GPU microseconds per replay."""
    graph = captured(bench.calls(bench.sharder("production"))["step"])
    return measure(graph.replay, bench.device, target_s, repeats)["gpu_us"]


def environment(device: torch.device) -> dict:
    import triton

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "numpy": np.__version__,
        "device": str(device),
        "cuda": torch.version.cuda,
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
    else:
        env["device_name"] = platform.processor() or platform.machine()
    env["commit"] = os.environ.get("SHARDSPEC_COMMIT")  # wins: a copied tree may carry another checkout's .git
    if env["commit"]:
        return env
    try:
        env["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):  # a copy of the tree without git history
        pass
    return env


def warm_up_device(device: torch.device, seconds: float = 2.0) -> None:
    """Busy the GPU for a while so that clocks have ramped up before the first measurement."""
    if device.type != "cuda":
        return
    a = torch.randn(4096, 4096, device=device)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = (a @ a).clamp_(-1, 1)
        synchronize(device)


def add_upstream(upstream_file: str):
    """Adds vLLM's file (through examples/upstream_vllm) to IMPLS as ``upstream``; returns its factory."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "upstream_vllm"))
    import shardspec_upstream

    shardspec_upstream.load_upstream(upstream_file)  # fails here, not in the first row, for a bad path
    IMPLS[UPSTREAM] = lambda *capacity, **options: shardspec_upstream.UpstreamSharder(
        *capacity, path=upstream_file, **options
    )
    return IMPLS[UPSTREAM]


def run(args) -> dict:
    if args.upstream is not None:
        if rules_of(args.profile).owner_by_table:
            raise SystemExit(
                f"--upstream with --profile {args.profile}: the adapter of vLLM's file passes no owner table"
            )
        add_upstream(args.upstream)
    print(header(UPSTREAM in IMPLS), flush=True)
    device = bench_device()
    warm_up_device(device)
    rows = []
    for tp in args.tp:
        for logits_per_req in args.logits_per_req:
            for num_reqs in args.num_reqs:
                bench = Bench(args, num_reqs, logits_per_req, tp, device)
                row = {"tp": tp, "num_reqs": num_reqs, "logits_per_req": logits_per_req}
                for impl in IMPLS:
                    calls = bench.calls(bench.sharder(impl))
                    for op in OPS:
                        row[f"{impl}.{op}"] = measure(calls[op], device, args.target_s, args.repeats)
                calls = bench.calls(bench.sharder("production", check_preconditions=False))
                for op in ("shard", "step"):
                    row[f"{UNCHECKED}.{op}"] = measure(calls[op], device, args.target_s, args.repeats)
                if args.graph and device.type == "cuda":
                    row["production.step_graph_gpu_us"] = graph_replay_us(bench, args.target_s, args.repeats)
                rows.append(row)
                print(format_row(row), flush=True)
    return {"environment": environment(device), "settings": settings(args), "rows": rows}


def settings(args) -> dict:
    return {
        "max_num_reqs": args.max_num_reqs,
        "max_num_logits_per_req": max(args.logits_per_req),
        "padded_vocab": args.vocab,
        "logprobs_dims": [args.num_logprobs, 0],
        "gather_num_nans": True,
        "grammar": None,
        "rank": 0,
        "communicator": "LoopbackComm",
        "check_preconditions": f"on, except in {UNCHECKED}.*",
        "upstream": args.upstream,
        "profile": args.profile,
    }


def header(with_upstream: bool) -> str:
    per_op = f"{'ref':>8} {'prod':>8} {'ratio':>7}" + (f" {'up':>8} {'ratio':>7}" if with_upstream else "")
    width = len(per_op)
    return (
        f"{'tp':>3} {'reqs':>5} {'n_i':>3} | "
        + " | ".join(f"{op:^{width}}" for op in OPS)
        + f" | {'no checks':^17} | {'graph':>7}\n{'':>14}| "
        + " | ".join(per_op for _ in OPS)
        + f" | {'shard':>8} {'step':>8} |   prod"
    )


def format_row(row: dict) -> str:
    """Wall us of each op: reference, production, their ratio (and upstream, its ratio to production)."""
    cells = []
    for op in OPS:
        ref, prod = row[f"reference.{op}"]["wall_us"], row[f"production.{op}"]["wall_us"]
        cell = f"{ref:8.1f} {prod:8.1f} {ref / prod:6.1f}x"
        if f"{UPSTREAM}.{op}" in row:
            upstream = row[f"{UPSTREAM}.{op}"]["wall_us"]
            cell += f" {upstream:8.1f} {upstream / prod:6.1f}x"
        cells.append(cell)
    cells.append(f"{row[UNCHECKED + '.shard']['wall_us']:8.1f} {row[UNCHECKED + '.step']['wall_us']:8.1f}")
    graph = row.get("production.step_graph_gpu_us")
    graph_cell = f"{graph:7.1f}" if graph is not None else f"{'-':>7}"
    return f"{row['tp']:>3} {row['num_reqs']:>5} {row['logits_per_req']:>3} | " + " | ".join(cells) + f" | {graph_cell}"


def format_table(result: dict) -> str:
    env = result["environment"]
    lines = [
        f"wall microseconds per call (median; graph: GPU us per replay of the captured production step); "
        f"device {env['device_name']}, torch {env['torch']}, triton {env['triton']}, "
        f"vocab {result['settings']['padded_vocab']}, "
        f"logprobs {result['settings']['logprobs_dims']}",
        header(result["settings"]["upstream"] is not None),
    ]
    lines += [format_row(row) for row in result["rows"]]
    gpu = [
        f"{r['tp']}/{r['num_reqs']}/{r['logits_per_req']}: ref {r['reference.step']['gpu_us']:.1f} "
        f"prod {r['production.step']['gpu_us']:.1f}"
        for r in result["rows"]
        if r["production.step"]["gpu_us"]
    ]
    if gpu:
        lines.append("GPU (CUDA events) microseconds per step, tp/reqs/n_i: " + "; ".join(gpu))
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    result = run(args)
    print("\n" + format_table(result))
    if args.out:
        save_json(args.out, result)
    return 0


def save_json(path: str, result: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as handle:
        json.dump(result, handle, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
