"""What one step costs the host, counted instead of timed, for each implementation side by side.

Per call of shard, gather and the whole step (rank 0 of a simulated group, as in bench_step.py):

* python: Python function calls (frames entered)
* c_calls: calls from Python into C functions (each torch and numpy call is one or more)
* aten: torch operators dispatched (views, allocations, copies, ...)
* allocs: tensors allocated (CPU or device memory)
* device: operations queued on the GPU (kernels, copies, memsets); GPU only
* syncs: operations that wait for the GPU (torch's sync debug mode); GPU only

Counts do not depend on how fast or how busy the host is, so unlike wall times they compare
across machines and runs. Under TRITON_INTERPRET=1 (no GPU) every Triton launch runs the
interpreter, whose own Python work and tensors are counted too: compare production and upstream
on a GPU. Each implementation runs warmed up, and its counts are averaged over --calls calls.

    python bench/step_counts.py [--tp 8] [--num-reqs 1024] [--logits-per-req 1] [--upstream FILE] [--out F]
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_step import IMPLS, OPS, Bench, add_upstream, bench_device, environment, parse_args, save_json, synchronize  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

COUNTS = ("python", "c_calls", "aten", "allocs", "device", "syncs")


def python_calls(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """(Python function calls, calls into C functions) per call of ``fn``."""
    counts = {"call": 0, "c_call": 0}

    def count(frame, event, arg):
        if event in counts:
            counts[event] += 1

    sys.setprofile(count)
    try:
        for _ in range(calls):
            fn()
    finally:
        sys.setprofile(None)
    # The profiler also sees the exit from fn's loop (one c_call: sys.setprofile).
    return counts["call"] / calls, max(0, counts["c_call"] - 1) / calls


class _OperatorCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def aten_operators(fn: Callable[[], object], calls: int) -> float:
    with _OperatorCount() as counter:
        for _ in range(calls):
            fn()
    return counter.count / calls


def allocations_and_device_ops(fn: Callable[[], object], calls: int, device: torch.device) -> tuple[float, float]:
    """(tensor allocations, GPU operations) per call, from torch's profiler."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events")  # torch 2.11, one cycle here
        with profile(activities=activities, profile_memory=True) as prof:
            for _ in range(calls):
                fn()
            synchronize(device)
    allocations = device_ops = 0
    for event in prof.events():
        # An allocation is reported on the operator that made it (its self memory), or as a lone
        # "[memory]" event when no operator was running; frees are negative.
        if event.self_cpu_memory_usage > 0 or event.self_device_memory_usage > 0:
            allocations += 1
        if event.device_type == torch.autograd.DeviceType.CUDA:
            device_ops += 1
    return allocations / calls, (device_ops / calls if device.type == "cuda" else float("nan"))


def synchronizations(fn: Callable[[], object], calls: int, device: torch.device) -> float:
    if device.type != "cuda":
        return float("nan")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(calls):
                fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught) / calls


def count_op(fn: Callable[[], object], calls: int, device: torch.device) -> dict:
    for _ in range(3):  # caches and compiled kernels in place before anything is counted
        fn()
    synchronize(device)
    python, c_calls = python_calls(fn, calls)
    allocs, device_ops = allocations_and_device_ops(fn, calls, device)
    return {
        "python": python,
        "c_calls": c_calls,
        "aten": aten_operators(fn, calls),
        "allocs": allocs,
        "device": device_ops,
        "syncs": synchronizations(fn, calls, device),
    }


def run(args, own) -> dict:
    if own.upstream is not None:
        add_upstream(own.upstream)
    device = bench_device()
    bench = Bench(args, own.num_reqs, own.logits_per_req, own.tp, device)
    counts = {
        impl: {op: count_op(fn, own.calls, device) for op, fn in bench.calls(bench.sharder(impl)).items()}
        for impl in IMPLS
    }
    return {
        "environment": environment(device),
        "shape": {
            "tp": own.tp,
            "num_reqs": own.num_reqs,
            "logits_per_req": own.logits_per_req,
            "max_num_reqs": args.max_num_reqs,
            "padded_vocab": args.vocab,
            "logprobs_dims": [args.num_logprobs, 0],
            "gather_num_nans": True,
            "communicator": "LoopbackComm",
            "calls": own.calls,
            "upstream": own.upstream,
        },
        "counts": counts,
    }


def format_table(result: dict) -> str:
    env, shape = result["environment"], result["shape"]
    lines = [
        f"per call, tp {shape['tp']}, {shape['num_reqs']} requests x {shape['logits_per_req']} rows; "
        f"device {env['device_name']}, torch {env['torch']}, triton {env['triton']}"
        + (" (Triton interpreter: launches counted with its work)" if env["triton_interpret"] else ""),
        f"{'op':<7} {'impl':<11} " + " ".join(f"{name:>8}" for name in COUNTS),
    ]
    for op in OPS:
        for impl, per_op in result["counts"].items():
            lines.append(f"{op:<7} {impl:<11} " + " ".join(_cell(per_op[op][name]) for name in COUNTS))
    return "\n".join(lines)


def _cell(value: float) -> str:
    if value != value:  # NaN: not measurable on this device
        return f"{'-':>8}"
    return f"{value:8.0f}" if value == int(value) else f"{value:8.1f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--num-reqs", type=int, default=1024)
    parser.add_argument("--logits-per-req", type=int, default=1)
    parser.add_argument("--calls", type=int, default=20, help="calls each count is averaged over")
    parser.add_argument("--upstream", metavar="FILE", help="also count vLLM's batch_shard.py at this path")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test, CPU)")
    parser.add_argument("--out", help="write the counts as JSON to this path")
    own = parser.parse_args(argv)
    args = parse_args(["--quick"] if own.quick else [])
    if own.quick:
        own.tp, own.num_reqs, own.calls = 2, min(own.num_reqs, 16), min(own.calls, 2)
    result = run(args, own)
    print(format_table(result))
    if own.out:
        save_json(own.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
