"""Why bfloat16 steps sit further above their floor than float32 ones: the copies of a step, by dtype.

At GPU-bound shapes (rank 0 of a simulated group, ``LoopbackComm``), for float32 and bfloat16 logits,
the device time of each copy a step makes, beside a plain contiguous copy of the same bytes:

* ``contiguous``: ``dst.copy_(src)`` over the received bytes (the kind of copy the floor's rate comes from);
* ``stand-in``: the all-to-all stand-in's broadcasting copy (``[tp, L_local, Vs]`` from ``[L_local, Vs]``),
  element by element in the logits dtype, and as int64 or complex128 (16-byte) words (``LoopbackComm``
  copies as the widest words from 64 MiB on);
* ``reorder``: the strided copy that lays the received chunks side by side, in the logits dtype and as
  int32 / int64 / complex128 words (production copies as the widest words from 64 MiB on: ``impl/sharder.py``);

then whole steps of production (shard + all-to-all + gather) with and without the widened copies, and
vLLM's file with ``--upstream``, timed wall-clock in alternation. Every variant runs once per round,
rounds alternate the order; medians of rounds. GB/s counts bytes read plus bytes written.

    python bench/copy_dtypes.py [--quick] [--upstream FILE] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_step import add_upstream, bench_device, burst_us, environment, synchronize, warm_up_device  # noqa: E402
from floors import floor_us, measure_floors, step_bytes  # noqa: E402
from scale_shapes import DTYPES, ScaleShape, implementations  # noqa: E402

from shardspec import comm as comm_module  # noqa: E402
from shardspec.impl import exchange as exchange_module

# (tp, requests, rows per request, vocab)
SHAPES = [(8, 4096, 4, 151936), (2, 1024, 4, 151936), (8, 4096, 8, 262144)]
QUICK_SHAPES = [(2, 8, 2, 256)]
NEVER = 1 << 62


def _event_us(fn, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps * 1e3


def _timer(device: torch.device):
    if device.type == "cuda":
        return _event_us
    return lambda fn, reps: burst_us(fn, device, reps)


def copies(tp: int, num_local: int, vocab: int, dtype: torch.dtype, device: torch.device) -> dict:
    """The copy variants of one shape: name -> (callable, bytes read + written)."""
    width = vocab // tp
    gen = torch.Generator(device=device).manual_seed(vocab)
    sent = torch.randn(num_local, width, device=device, generator=gen).to(dtype)
    received = torch.empty(tp * num_local, width, dtype=dtype, device=device)
    received.view(tp, num_local, width).copy_(sent)
    out = torch.empty_like(received)
    moved = 2 * received.numel() * received.element_size()
    # The stand-in reads one [L_local, Vs] chunk tp times (from L2 or HBM) and writes the whole buffer.
    standin_moved = moved

    def strided(buffer, view_dtype):
        chunk = buffer.view(view_dtype) if view_dtype is not None else buffer
        words = chunk.shape[-1]
        return chunk.as_strided((num_local, tp, words), (words, num_local * words, 1))

    variants = {
        "contiguous": (lambda: out.copy_(received), moved),
        "stand-in, elementwise": (lambda: received.view(tp, num_local, width).copy_(sent), standin_moved),
        "stand-in, int64 words": (
            lambda: received.view(tp, -1).view(torch.int64).copy_(sent.view(1, -1).view(torch.int64)),
            standin_moved,
        ),
        "stand-in, complex128 words": (
            lambda: received.view(tp, -1).view(torch.complex128).copy_(sent.view(1, -1).view(torch.complex128)),
            standin_moved,
        ),
        "reorder, elementwise": (lambda: strided(received, None).reshape(num_local, tp * width), moved),
    }
    row_bytes = width * received.element_size()
    for name, wide in (("int32", torch.int32), ("int64", torch.int64), ("complex128", torch.complex128)):
        size = torch.empty(0, dtype=wide).element_size()
        if size > received.element_size() and row_bytes % size == 0:
            words = row_bytes // size
            variants[f"reorder, {name} words"] = (
                lambda wide=wide, words=words: strided(received, wide).reshape(num_local, tp * words),
                moved,
            )
    return variants


def time_copies(variants: dict, device: torch.device, rounds: int, reps: int) -> dict:
    timer = _timer(device)
    for fn, _ in variants.values():
        fn()
    synchronize(device)
    times = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            times[name].append(timer(variants[name][0], reps))
    out = {}
    for name, values in times.items():
        median = statistics.median(values)
        out[name] = {"us": median, "min_us": min(values), "GB_per_s": variants[name][1] / median / 1e3}
    return out


def _with_thresholds(fn, impl_from: int, standin_from: int):
    def call():
        exchange_module._WIDEN_FROM_BYTES = impl_from
        comm_module._WIDEN_FROM_BYTES = standin_from
        return fn()

    return call


def time_steps(shape: ScaleShape, device: torch.device, rounds: int, calls: int) -> dict:
    """Wall us per step: production with neither, one or both widened copies; vLLM's file with either stand-in."""
    default_impl, default_standin = exchange_module._WIDEN_FROM_BYTES, comm_module._WIDEN_FROM_BYTES
    variants = {
        "production, no widened copy": _with_thresholds(shape.step_call("production"), NEVER, NEVER),
        "production, widened stand-in": _with_thresholds(shape.step_call("production"), NEVER, default_standin),
        "production, widened reorder + stand-in": _with_thresholds(
            shape.step_call("production"), default_impl, default_standin
        ),
    }
    if "upstream" in implementations():
        variants["upstream, elementwise stand-in"] = _with_thresholds(shape.step_call("upstream"), NEVER, NEVER)
        variants["upstream, widened stand-in"] = _with_thresholds(
            shape.step_call("upstream"), default_impl, default_standin
        )
    try:
        for fn in variants.values():
            fn()
            fn()
        times = {name: [] for name in variants}
        names = list(variants)
        for round_ in range(rounds):
            for name in names if round_ % 2 == 0 else names[::-1]:
                times[name].append(burst_us(variants[name], device, calls))
    finally:
        exchange_module._WIDEN_FROM_BYTES, comm_module._WIDEN_FROM_BYTES = default_impl, default_standin
    base = times["production, no widened copy"]
    return {
        name: {
            "us": statistics.median(values),
            "q1": statistics.quantiles(values, n=4)[0] if len(values) > 1 else values[0],
            "q3": statistics.quantiles(values, n=4)[2] if len(values) > 1 else values[0],
            "over_no_widening": statistics.median([a / b for a, b in zip(values, base, strict=True)]),
        }
        for name, values in times.items()
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one tiny shape (smoke test, CPU)")
    parser.add_argument("--upstream", metavar="FILE", help="also time vLLM's batch_shard.py at this path")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", help="write the results as JSON to this path")
    args = parser.parse_args(argv)
    if args.upstream:
        add_upstream(args.upstream)
    device = bench_device()
    warm_up_device(device)
    started = time.perf_counter()
    shapes = QUICK_SHAPES if args.quick else SHAPES
    rounds = 2 if args.quick else args.rounds
    result = {"environment": environment(device), "floors": measure_floors(device), "shapes": []}
    floors = result["floors"]
    print(f"floors: launch {floors['launch']['wall_us']:.1f} us, copy {floors['copy']['bytes_per_s'] / 1e12:.2f} TB/s")
    for tp, num_reqs, rows, vocab in shapes:
        for dtype in ("float32", "bfloat16"):
            capacity = (max(num_reqs, 16), rows)
            shape = ScaleShape(num_reqs, rows, tp, vocab, dtype, capacity=capacity, num_logprobs=2, device=device)
            num_local = shape.num_local_logits
            row = {"tp": tp, "num_reqs": num_reqs, "rows": rows, "vocab": vocab, "dtype": dtype}
            row["num_local_logits"] = num_local
            row["bytes"] = step_bytes(shape.num_logits, num_local, vocab, tp, DTYPES[dtype].itemsize)
            row["floor_us"] = floor_us(row["bytes"]["must_move"], floors)
            row["copies"] = time_copies(copies(tp, num_local, vocab, DTYPES[dtype], device), device, rounds, 5)
            row["steps"] = time_steps(shape, device, rounds, 1 if args.quick else 5)
            for step in row["steps"].values():
                step["x_floor"] = step["us"] / row["floor_us"]
            result["shapes"].append(row)
            print(format_row(row), flush=True)
            del shape
            synchronize(device)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    result["seconds"] = time.perf_counter() - started
    result["command"] = " ".join(["python", "bench/copy_dtypes.py", *(argv if argv is not None else sys.argv[1:])])
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)
    return 0


def format_row(row: dict) -> str:
    head = (
        f"tp {row['tp']}, {row['num_reqs']} x {row['rows']} rows, vocab {row['vocab']}, {row['dtype']}: "
        f"L_local {row['num_local_logits']}, received {row['bytes']['reorder'] / 2e6:.0f} MB, "
        f"floor {row['floor_us']:.0f} us"
    )
    lines = [head, "  copy                               us    GB/s (read + write)"]
    lines += [f"  {name:<28} {c['us']:9.1f} {c['GB_per_s']:8.0f}" for name, c in row["copies"].items()]
    lines.append("  step (wall)                                    us (q1-q3)       x floor  / no widening")
    lines += [
        f"  {name:<40} {s['us']:9.1f} ({s['q1']:.0f}-{s['q3']:.0f}) {s['x_floor']:6.2f}x {s['over_no_widening']:6.3f}"
        for name, s in row["steps"].items()
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
