"""Fewer passes over the logits after the all-to-all: two prototypes against today's exchange.

Today (``ProductionSharder.all_to_all_logits``) the all-to-all receives chunk r = rank r's vocab
shard of the L_local rows, chunks one after another ([tp, L_local, Vs]), and one reorder copy lays
each row's shards side by side ([L_local, V], contiguous). Prototypes, all rank 0 of a simulated
group (``LoopbackComm``):

* vocab-major wire: every sender lays its chunk for rank d out as [Vs, L_d] (vocab-major). The
  received buffer is then [V, L_local] row-major, so ``recv.view(V, L_local).t()`` is a valid
  [L_local, V] view with strides (1, L_local): no copy after the all-to-all. The LM head can emit
  that layout: ``lm_head_layouts`` times the matmul both ways.
* fused consumer: today's receive buffer is read in place by one Triton kernel that computes what
  greedy sampling with a logprob needs (argmax and logsumexp per row), so the reorder never runs.

Each variant is checked against today's result before it is timed (same values, same argmax,
logsumexp within rounding); times alternate between variants within each round.

    python bench/wire_layout.py [--quick] [--out wire.json]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported: it reads the variable then

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from bench_step import bench_device, environment, save_json, warm_up_device  # noqa: E402
from samplers import top_p  # noqa: E402
from scale_shapes import ScaleShape, interleave, ratio_spread, spread  # noqa: E402

from shardspec.comm import LoopbackComm  # noqa: E402

# (tp, requests, rows per request, vocab, dtype)
SHAPES = [
    (2, 1024, 4, 151936, "bfloat16"),
    (2, 1024, 4, 151936, "float32"),
    (8, 1024, 4, 151936, "bfloat16"),
    (8, 4096, 4, 151936, "float32"),
    (8, 4096, 8, 262144, "bfloat16"),
    (4, 4096, 1, 128256, "bfloat16"),
    (8, 1024, 1, 32768, "float32"),
    (8, 64, 1, 151936, "bfloat16"),
]
QUICK_SHAPES = [(2, 8, 2, 256, "float32"), (2, 8, 1, 256, "bfloat16")]
LM_HEAD = [(8, 256, 4096, 151936), (8, 4096, 4096, 151936)]  # (tp, rows, hidden, vocab), bfloat16
QUICK_LM_HEAD = [(2, 8, 16, 64)]


@triton.jit
def chunked_greedy_kernel(recv_ptr, ids_ptr, lse_ptr, width, num_rows, TP: tl.constexpr, BLOCK: tl.constexpr):
    """Row ``program_id`` of a [TP, rows, width] receive buffer as one full-vocab row: argmax and logsumexp."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK], tl.int64)
    sum_exp = tl.zeros([BLOCK], tl.float32)
    for r in range(TP):
        base = recv_ptr + (row + r * num_rows) * width  # row is int64: no overflow past 2**31 elements
        for start in range(0, width, BLOCK):
            cols = start + offs
            x = tl.load(base + cols, mask=cols < width, other=float("-inf")).to(tl.float32)
            new_best = tl.maximum(best, x)
            # Online softmax sum; lanes that have seen only padding stay at 0
            # (-inf - -inf would be NaN: such lanes subtract 0 instead, and exp(-inf) is 0.)
            shift = tl.where(new_best == float("-inf"), 0.0, new_best)
            sum_exp = sum_exp * tl.exp(best - shift) + tl.exp(x - shift)
            # Strictly greater keeps the first maximum of a lane, as torch.argmax keeps the first overall.
            best_idx = tl.where(x > best, r * width + cols.to(tl.int64), best_idx)
            best = new_best
    top = tl.max(best, 0)
    total = tl.sum(sum_exp * tl.where(best == float("-inf"), 0.0, tl.exp(best - top)), 0)
    first = tl.min(tl.where(best == top, best_idx, TP * width), 0)
    tl.store(ids_ptr + row, first)
    tl.store(lse_ptr + row, top + tl.log(total))


def fused_greedy(received: torch.Tensor, tp: int, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(argmax ids, logsumexp) of each row of a chunk-major [tp * rows, width] receive buffer, read in place."""
    ids = torch.empty(rows, dtype=torch.int64, device=received.device)
    lse = torch.empty(rows, dtype=torch.float32, device=received.device)
    if rows:
        block = 256 if os.environ.get("TRITON_INTERPRET") == "1" else 2048
        chunked_greedy_kernel[(rows,)](received, ids, lse, width, rows, TP=tp, BLOCK=block, num_warps=8)
    return ids, lse


def torch_greedy(full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same two results from a [L_local, V] tensor (any strides) with torch."""
    return full.argmax(dim=-1), torch.logsumexp(full.float(), dim=-1)


class Exchange:
    """Rank 0's all-to-all of one shape three ways, over one shared set of logits."""

    def __init__(self, shape: ScaleShape):
        self.shape, self.tp = shape, shape.tp
        self.sharder = shape.sharder("production")
        self.plan = self.sharder.shard_sampler_inputs(shape.batch, None).metadata
        self.local = self.plan.num_local_logits
        self.width = shape.logits_shard.shape[1]
        self.comm = LoopbackComm(0, self.tp)
        shard, splits = shape.logits_shard, self.plan.num_logits_per_rank
        # The vocab-major send buffer: chunk d is [Vs, L_d], the same values as today's rows of chunk d.
        chunks = torch.split(shard, splits)
        self.send_vm = torch.cat([chunk.t().reshape(-1) for chunk in chunks])
        self.send_splits_vm = [self.width * rows for rows in splits]
        self.recv_vm = torch.empty(self.tp * self.local * self.width, dtype=shard.dtype, device=shard.device)
        self.recv = torch.empty(self.tp * self.local, self.width, dtype=shard.dtype, device=shard.device)

    def today(self) -> torch.Tensor:
        return self.sharder.all_to_all_logits(self.shape.logits_shard, self.plan)

    def vocab_major(self) -> torch.Tensor:
        self.comm.all_to_all_single(
            self.recv_vm, self.send_vm, [self.width * self.local] * self.tp, self.send_splits_vm
        )
        return self.recv_vm.view(self.tp * self.width, self.local).t()

    def chunked(self) -> torch.Tensor:
        """Today's all-to-all alone: the chunk-major receive buffer, not reordered."""
        self.comm.all_to_all_single(
            self.recv, self.shape.logits_shard, [self.local] * self.tp, self.plan.num_logits_per_rank
        )
        return self.recv

    def fused(self):
        return fused_greedy(self.chunked(), self.tp, self.local, self.width)


def check(exchange: Exchange) -> None:
    """Every prototype gives today's values; fails loudly naming the variant that differs."""
    reference = exchange.today()
    vocab_major = exchange.vocab_major()
    if vocab_major.stride() != (1, exchange.local) and exchange.local > 1:
        raise AssertionError(f"vocab-major view has strides {vocab_major.stride()}")
    if not torch.equal(reference, vocab_major):
        raise AssertionError("vocab-major wire: the received view differs from today's [L_local, V]")
    ids, lse = torch_greedy(reference)
    fused_ids, fused_lse = exchange.fused()
    if not torch.equal(ids, fused_ids):
        raise AssertionError(f"fused consumer: argmax differs in {int((ids != fused_ids).sum())} rows")
    if not torch.allclose(lse, fused_lse, rtol=1e-4, atol=1e-4):
        raise AssertionError(f"fused consumer: logsumexp off by {float((lse - fused_lse).abs().max())}")


def measure_shape(shape_args: tuple, device, rounds: int, burst_s: float) -> dict:
    tp, num_reqs, rows, vocab, dtype = shape_args
    shape = ScaleShape(
        num_reqs, rows, tp, vocab, dtype, capacity=(max(4096, num_reqs), max(8, rows)), num_logprobs=0, device=device
    )
    exchange = Exchange(shape)
    check(exchange)
    calls = {
        "today": exchange.today,
        "vocab_major": exchange.vocab_major,
        "today+greedy": lambda: torch_greedy(exchange.today()),
        "vocab_major+greedy": lambda: torch_greedy(exchange.vocab_major()),
        "fused_greedy": exchange.fused,
        "today+top_p": lambda: top_p(exchange.today()),
        "vocab_major+top_p": lambda: top_p(exchange.vocab_major()),
    }
    times = interleave(calls, device, rounds, burst_s)
    row = {
        "tp": tp,
        "num_reqs": num_reqs,
        "rows": rows,
        "vocab": vocab,
        "dtype": dtype,
        "num_local_logits": exchange.local,
        "received_bytes": exchange.recv.numel() * exchange.recv.element_size(),
    }
    row.update({name: spread(values) for name, values in times.items()})
    row["ratios"] = {
        "exchange: vocab_major / today": ratio_spread(times["vocab_major"], times["today"]),
        "greedy: vocab_major / today": ratio_spread(times["vocab_major+greedy"], times["today+greedy"]),
        "greedy: fused / today": ratio_spread(times["fused_greedy"], times["today+greedy"]),
        "top_p: vocab_major / today": ratio_spread(times["vocab_major+top_p"], times["today+top_p"]),
    }
    return row


def lm_head_layouts(shape_args: tuple, device, rounds: int, burst_s: float) -> dict:
    """The LM head's matmul emitting its vocab shard row-major, vocab-major, and as per-destination chunks."""
    tp, rows, hidden, vocab = shape_args
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(rows)
    h = torch.randn(rows, hidden, device=device, dtype=dtype, generator=gen)
    weight = torch.randn(hidden, vocab // tp, device=device, dtype=dtype, generator=gen) / hidden**0.5
    splits = [len(part) for part in torch.arange(rows).tensor_split(tp)]
    send = torch.empty(rows * (vocab // tp), device=device, dtype=dtype)

    def per_destination():
        offset, start = 0, 0
        for count in splits:
            out = send[offset : offset + count * weight.shape[1]].view(weight.shape[1], count)
            torch.mm(weight.t(), h[start : start + count].t(), out=out)
            offset, start = offset + out.numel(), start + count
        return send

    calls = {
        "row_major": lambda: torch.mm(h, weight),
        "vocab_major": lambda: torch.mm(weight.t(), h.t()),
        "per_destination": per_destination,
    }
    expected = calls["row_major"]()
    first = calls["per_destination"]()[: weight.shape[1] * splits[0]].view(weight.shape[1], splits[0])
    if not torch.allclose(first.t().float(), expected[: splits[0]].float(), rtol=2e-2, atol=2e-2):
        raise AssertionError("per-destination LM head: chunk 0 differs from the row-major matmul")
    times = interleave(calls, device, rounds, burst_s)
    row = {"tp": tp, "rows": rows, "hidden": hidden, "vocab": vocab, "dtype": str(dtype).replace("torch.", "")}
    row.update({name: spread(values) for name, values in times.items()})
    row["vocab_major / row_major"] = ratio_spread(times["vocab_major"], times["row_major"])
    row["per_destination / row_major"] = ratio_spread(times["per_destination"], times["row_major"])
    return row


def _cell(stats: dict) -> str:
    return f"{stats['median']:9.1f}"


def format_report(result: dict) -> str:
    names = [
        "today",
        "vocab_major",
        "today+greedy",
        "vocab_major+greedy",
        "fused_greedy",
        "today+top_p",
        "vocab_major+top_p",
    ]
    lines = [
        "exchange variants, wall us per call (median of rounds); ratios: median (quartiles) of per-round ratios",
        " tp  reqs  n  vocab  dt  L_loc | " + " ".join(f"{n[:9]:>9}" for n in names),
    ]
    for row in result["exchange"]:
        lines.append(
            f"{row['tp']:>3} {row['num_reqs']:>5} {row['rows']:>2} {row['vocab']:>6} {row['dtype'][:4]} "
            f"{row['num_local_logits']:>6} | " + " ".join(_cell(row[n]) for n in names)
        )
        lines.append(
            "      "
            + "; ".join(f"{k} {v['median']:.3f} ({v['q1']:.3f}-{v['q3']:.3f})" for k, v in row["ratios"].items())
        )
    lines.append("LM head (bfloat16 on the GPU): row-major [L, Vs], vocab-major [Vs, L], per-destination [Vs, L_d]")
    for row in result["lm_head"]:
        lines.append(
            f"tp {row['tp']} rows {row['rows']} hidden {row['hidden']} vocab {row['vocab']}: "
            + ", ".join(f"{n} {row[n]['median']:.1f} us" for n in ("row_major", "vocab_major", "per_destination"))
            + f"; vocab-major/row-major {row['vocab_major / row_major']['median']:.3f}, per-destination/"
            f"row-major {row['per_destination / row_major']['median']:.3f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes (smoke test, CPU)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", help="write the results as JSON to this path")
    args = parser.parse_args(argv)
    device = bench_device()
    warm_up_device(device)
    rounds, burst_s = (2, 0.0) if args.quick else (args.rounds, 0.02)
    result = {
        "environment": environment(device),
        "exchange": [],
        "lm_head": [],
        "command": " ".join(["python", "bench/wire_layout.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    for shape_args in QUICK_SHAPES if args.quick else SHAPES:
        result["exchange"].append(measure_shape(shape_args, device, rounds, burst_s))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for shape_args in QUICK_LM_HEAD if args.quick else LM_HEAD:
        result["lm_head"].append(lm_head_layouts(shape_args, device, rounds, burst_s))
    print(format_report(result))
    if args.out:
        save_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
