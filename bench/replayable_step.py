"""A captured step an engine can replay, with the spec's own wire: production's step as one CUDA graph per
batch shape, replayed for other batches of that shape.

Under owner rule position_mod_tp (vllm-0.34) a request's owner is its batch position % tp, so what the
host derives for a step (owners, split sizes, the local counts, the padding, ``gathered_src_indices``)
depends only on the number of requests N and their rows; where every request has the same number of rows
W (decoding without drafts, or a fixed draft length without adaptive verification), only on (N, W). A step
captured for one batch of N requests of W rows is then exactly the spec's step, wire included, for every
batch of that shape: the engine writes the batch's device fields into the captured inputs and replays. (No
padded wire, unlike examples/cuda_graph_step; under slot ownership or an owner table the owners depend on
the slots or on earlier steps, so no shape key exists.)

For each shape this checks that claim and times it, rank 0 of a simulated group on one GPU (LoopbackComm),
rounds alternating in one process:

* ``replay``: write a new batch's four device fields (idx_mapping, logits_indices, seq_lens, cu_num_logits)
  into the captured inputs, replay, slice the local host fields; the check compares every local field and
  every gathered output with an eager step of production on that batch, and fails (exit 1) on a difference;
* ``eager``: production's eager step; ``upstream``: vLLM's file (``--upstream FILE``), eager.

What it costs is one graph per shape the engine runs: the table gives the capture time per shape. (The
memory a graph keeps is not measured: the caching allocator's reserved total moves by more than a graph
holds between the warm-up and the capture.)

    python bench/replayable_step.py [--upstream FILE] [--rounds 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_step import IMPLS, UPSTREAM, Bench, add_upstream, burst_us, parse_args, warm_up_for_capture  # noqa: E402

from shardspec.engine import engine_step  # noqa: E402
from shardspec.spec.builders import build_input_batch  # noqa: E402
from shardspec.spec.profiles import DEFAULT_PROFILE, rules_of  # noqa: E402

# The device fields of a batch that the captured step reads: the engine writes them in place each step.
DEVICE_FIELDS = ("idx_mapping", "logits_indices", "seq_lens", "cu_num_logits")


class Captured:
    """Production's whole step for one batch shape, as one CUDA graph."""

    def __init__(self, bench: Bench):
        # Its own copy of the batch's device fields, which every replay overwrites.
        fields = {name: getattr(bench.batch, name).clone() for name in DEVICE_FIELDS}
        self.bench, self.static = bench, dataclasses.replace(bench.batch, **fields)
        self.sharder = bench.sharder("production")
        self.gather_kwargs = {"gather_num_nans": True, "logprobs_dims": bench.dims}
        first = self.sharder.shard_sampler_inputs(self.static, None)
        self.output = bench.local_output(first.local_batch)
        warm_up_for_capture(self._step)
        torch.cuda.synchronize()
        start = time.perf_counter()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.shard, _, _, self.gathered = self._step()
        torch.cuda.synchronize()
        self.capture_ms = (time.perf_counter() - start) * 1e3

    def _step(self):
        return engine_step(
            self.sharder,
            self.static,
            None,
            lambda shard: self.bench.logits_shard,
            lambda full, shard: self.output,
            self.gather_kwargs,
        )

    def replay(self, batch) -> np.ndarray:
        """One step on ``batch`` (of the captured shape): its local slots on the host, what the engine's
        sampler reads there."""
        for name in DEVICE_FIELDS:
            getattr(self.static, name).copy_(getattr(batch, name), non_blocking=True)
        self.graph.replay()
        tp, rank = self.sharder.tp_size, self.sharder.rank
        return batch.idx_mapping_np[rank::tp]


def another_batch(bench: Bench, args, seed: int):
    """A batch of the bench batch's shape with other slots and other sequence lengths."""
    rng = np.random.default_rng(seed)
    num_reqs, rows = bench.batch.num_reqs, int(bench.batch.cu_num_logits_np[1]) if bench.batch.num_reqs else 1
    slots = rng.permutation(args.max_num_reqs)[:num_reqs]
    seq_lens = rng.integers(rows, 4096, num_reqs).tolist()
    return build_input_batch(slots, [rows] * num_reqs, seq_lens=seq_lens, device=bench.device)


def differences(captured: Captured, batch, local_slots: np.ndarray) -> list[str]:
    """Where the replay on ``batch`` differs from production's eager step on it."""
    eager_sharder = captured.bench.sharder("production")
    shard, _, _, gathered = engine_step(
        eager_sharder,
        batch,
        None,
        lambda s: captured.bench.logits_shard,
        lambda full, s: captured.output,
        captured.gather_kwargs,
    )
    torch.cuda.synchronize()
    found = []
    local, replayed = shard.local_batch, captured.shard.local_batch
    for name in ("idx_mapping", "cu_num_logits", "logits_indices", "seq_lens", "expanded_idx_mapping"):
        if not torch.equal(getattr(local, name), getattr(replayed, name)):
            found.append(f"local {name}")
    if not np.array_equal(local.idx_mapping_np, local_slots):
        found.append("local idx_mapping_np")
    if not torch.equal(shard.sorted_logits_indices, captured.shard.sorted_logits_indices):
        found.append("sorted_logits_indices")
    if shard.metadata.num_logits_per_rank != captured.shard.metadata.num_logits_per_rank:
        found.append("num_logits_per_rank")
    for name in ("sampled_token_ids", "num_sampled", "num_rejected", "num_nans"):
        if not torch.equal(getattr(gathered, name), getattr(captured.gathered, name)):
            found.append(f"gathered {name}")
    for index, part in enumerate(gathered.logprobs_tensors[:3]):
        if not torch.equal(part, captured.gathered.logprobs_tensors[index]):
            found.append(f"gathered logprobs[{index}]")
    return found


def rounds(calls: dict, rounds_: int, burst: int, device) -> dict:
    """Median wall us per call of each, and the median per-round ratio to upstream (or to eager)."""
    times = {name: [] for name in calls}
    for round_ in range(rounds_):
        order = list(calls) if round_ % 2 == 0 else list(reversed(calls))
        for name in order:
            times[name].append(burst_us(calls[name], device, burst))
    base = UPSTREAM if UPSTREAM in calls else "eager"
    return {
        name: (statistics.median(t), statistics.median(a / b for a, b in zip(t, times[base], strict=True)))
        for name, t in times.items()
    }


def shape_row(bench: Bench, args, own) -> tuple[str, list[str]]:
    """One shape: capture, check the replays against eager steps, time them; (the table's line, differences)."""
    captured = Captured(bench)
    batches = itertools.cycle([another_batch(bench, args, seed) for seed in range(4)])
    found = [d for b in [next(batches) for _ in range(4)] for d in differences(captured, b, captured.replay(b))]
    calls = {
        "replay": lambda: captured.replay(next(batches)),
        "eager": bench.calls(bench.sharder("production"))["step"],
    }
    if UPSTREAM in IMPLS:
        calls[UPSTREAM] = bench.calls(bench.sharder(UPSTREAM))["step"]
    timed = rounds(calls, own.rounds, own.burst, bench.device)
    cells = [f"{timed[n][0]:7.1f} ({timed[n][1]:.3f}x)" for n in ("replay", "eager")]
    upstream = f"{timed[UPSTREAM][0]:7.1f}" if UPSTREAM in timed else "      -"
    check = "same as eager" if not found else "DIFFERS: " + ", ".join(sorted(set(found)))
    shape = f"{bench.tp}/{bench.batch.num_reqs}/{int(bench.batch.num_logits) // max(1, bench.batch.num_reqs)}"
    line = f"{shape} | {cells[0]} | {cells[1]} | {upstream} | {captured.capture_ms:.1f} | {check}"
    return line, found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", metavar="FILE", help="also time vLLM's batch_shard.py, eager")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--burst", type=int, default=100, help="calls per timed burst")
    own = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("replayable_step: needs a CUDA GPU (CUDA graphs); none is here", file=sys.stderr)
        return 2
    if rules_of(DEFAULT_PROFILE).owner != "position_mod_tp":
        print("replayable_step: the default profile's owner rule is not position_mod_tp", file=sys.stderr)
        return 2
    if own.upstream:
        add_upstream(own.upstream)
    args, device, status = parse_args([]), torch.device("cuda"), 0
    print("tp/reqs/rows | replay us (x upstream) | eager us (x upstream) | upstream us | capture ms | check")
    # The bench table's shapes (bench_step.py's defaults).
    for tp, num_reqs, rows in itertools.product(args.tp, args.num_reqs, args.logits_per_req):
        line, found = shape_row(Bench(args, num_reqs, rows, tp, device), args, own)
        print(line, flush=True)
        status |= bool(found)
    return status


if __name__ == "__main__":
    sys.exit(main())
