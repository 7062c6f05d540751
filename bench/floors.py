"""What no step can beat, measured on the device of the run: a launch, a copy, the bytes a step must move.

* ``launch_floor``: wall and GPU microseconds per launch of an empty Triton kernel, launched the
  way production launches its kernels (``shardspec.impl.launch.Launcher``), back to back.
* ``copy_bandwidth``: bytes read plus bytes written per second by a large device-to-device copy.
* ``step_bytes``: the logits bytes one rank's step must move (the all-to-all reads the rows it
  sends and writes the rows it receives) and what the reorder copy after it adds.

The floor of a shape is ``launch floor + must-move bytes / copy bandwidth``: one launch and the
exchange at the copy rate (see bench/NOTES.md for why the reorder is not part of it).

    python bench/floors.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton and the launcher read it

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from shardspec.impl.launch import Launcher  # noqa: E402


@triton.jit
def _empty_kernel(ptr, BLOCK: tl.constexpr):
    pass


_launch_empty = Launcher(_empty_kernel)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def launch_floor(device: torch.device, launches: int = 2000, repeats: int = 5) -> dict:
    """Median wall and GPU us per empty-kernel launch over ``repeats`` bursts of ``launches``."""
    target = torch.empty(1, device=device)
    # The launcher reads the stream of the device index in the key: a CUDA device needs its index.
    key = (torch.cuda.current_device() if device.type == "cuda" else None, 1)
    launches = launches if device.type == "cuda" else 3  # the interpreter runs each launch in Python

    def launch():
        _launch_empty(1, key, (target,), {"BLOCK": 1})

    for _ in range(min(50, launches)):
        launch()
    walls, gpus = [], []
    for _ in range(repeats):
        _sync(device)
        events = _events(device)
        start = time.perf_counter()
        for _ in range(launches):
            launch()
        if events:
            events[1].record()
        _sync(device)
        walls.append((time.perf_counter() - start) / launches * 1e6)
        if events:
            gpus.append(events[0].elapsed_time(events[1]) / launches * 1e3)
    return {
        "wall_us": statistics.median(walls),
        "gpu_us": statistics.median(gpus) if gpus else None,
        "launches": launches,
        "repeats": repeats,
    }


def _events(device: torch.device):
    if device.type != "cuda":
        return None
    events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
    events[0].record()
    return events


def copy_bandwidth(device: torch.device, nbytes: int = 2 << 30, repeats: int = 10) -> dict:
    """Median bytes (read + written) per second of ``dst.copy_(src)`` over two ``nbytes`` buffers."""
    if device.type != "cuda":
        nbytes = 1 << 20
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        _sync(device)
        events = _events(device)
        start = time.perf_counter()
        dst.copy_(src)
        if events:
            events[1].record()
        _sync(device)
        times.append(events[0].elapsed_time(events[1]) / 1e3 if events else time.perf_counter() - start)
    seconds = statistics.median(times)
    return {"bytes_per_s": 2 * nbytes / seconds, "buffer_bytes": nbytes, "seconds": seconds, "repeats": repeats}


def step_bytes(num_logits: int, num_local_logits: int, vocab: int, tp: int, itemsize: int) -> dict:
    """Logits bytes of one rank's step: what the exchange must move, and the reorder copy beside it.

    The rank reads the ``num_logits`` rows of its vocab shard that it sends and writes the
    ``num_local_logits`` full-vocab rows it receives. Laying the received chunks side by side
    (today's reorder) reads and writes the received rows once more.
    """
    shard_width = vocab // tp
    exchange = (num_logits * shard_width + num_local_logits * vocab) * itemsize
    return {
        "must_move": exchange,
        "reorder": 2 * num_local_logits * vocab * itemsize,
        "logits_per_rank": num_logits * shard_width * itemsize,
    }


def floor_us(must_move_bytes: int, floors: dict) -> float:
    """One launch plus the must-move bytes at the measured copy rate."""
    return floors["launch"]["wall_us"] + must_move_bytes / floors["copy"]["bytes_per_s"] * 1e6


def measure_floors(device: torch.device) -> dict:
    return {"launch": launch_floor(device), "copy": copy_bandwidth(device)}


def main() -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(json.dumps(measure_floors(device), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
