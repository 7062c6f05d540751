"""Peak device memory of torch's sort and of each sampler, per element, against the batch's rows.

The replicated baseline sorts [L, V]; the sharded path sorts [L / tp, V]. Sharding divides the
sampler's memory by tp only if its temporaries are a fixed number of bytes per element. This prints,
per row count, each one's peak above its input divided by rows x vocab, so a change of bytes per
element (torch's CUDA sort works through at most 2**31 - 1 elements at a time) shows as a step.

    python bench/sort_memory.py [--vocab 151936] [--rows 2048,4096,8192,14000,16384] [--out sort.json]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_step import bench_device, environment, save_json  # noqa: E402
from samplers import SAMPLERS  # noqa: E402
from scale_shapes import peak_step_bytes  # noqa: E402


def sort_rows(logits: torch.Tensor):
    return logits.float().sort(dim=-1)


def measure(device, vocab: int, rows: list[int], dtype=torch.bfloat16) -> list[dict]:
    """One row per (function, row count): peak bytes above the input, and per element."""
    functions = {"sort": sort_rows, **{name: SAMPLERS[name] for name in ("top_p", "top_p_sort_free")}}
    out = []
    for count in rows:
        logits = torch.randn(count, vocab, device=device, dtype=dtype)
        for name, fn in functions.items():
            peak = peak_step_bytes(functools.partial(fn, logits), device)
            elements = count * vocab
            out.append(
                {
                    "function": name,
                    "rows": count,
                    "vocab": vocab,
                    "elements": elements,
                    "peak_bytes": peak,
                    "bytes_per_element": peak / elements,
                    "above_int32": elements > 2**31 - 1,
                }
            )
            if device.type == "cuda":
                torch.cuda.empty_cache()
        del logits
    return out


def format_rows(rows: list[dict]) -> str:
    lines = ["function          rows   vocab   elements   > 2^31-1   peak GB   bytes / element"]
    for r in rows:
        lines.append(
            f"{r['function']:<15} {r['rows']:>6} {r['vocab']:>7} {r['elements']:>10} {str(r['above_int32']):>10} "
            f"{r['peak_bytes'] / 1e9:9.2f} {r['bytes_per_element']:17.2f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--rows", default="2048,4096,8192,14000,16384", help="comma-separated row counts")
    parser.add_argument("--out", help="write the rows as JSON to this path")
    args = parser.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows: expected comma-separated integers, got {args.rows!r}")
    if args.vocab < 1 or any(r < 1 for r in rows):
        parser.error("--vocab and every --rows value must be at least 1")
    device = bench_device()
    result = {"environment": environment(device), "rows": measure(device, args.vocab, rows)}
    print(format_rows(result["rows"]))
    if args.out:
        save_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
