"""Batches, logits and timed calls for one deployment-sized shape (rank 0 of a simulated group).

Shared by ``scale_grid.py`` and ``wire_layout.py``. Slots are drawn so that requests are spread
round-robin over the owners and rank 0 owns ceil(num_reqs / tp) of them: rank 0 is then the most
loaded rank, the one that bounds a real step (a random draw can leave it with no rows at all).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import numpy as np
import torch
from bench_step import IMPLS, Bench, burst_us, engine_batch, synchronize

from shardspec.comm import LoopbackComm
from shardspec.engine import engine_step
from shardspec.spec.model import SamplerOutput
from shardspec.spec.profiles import DEFAULT_PROFILE

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def balanced_slots(num_reqs: int, tp: int, max_num_reqs: int, rng: np.random.Generator) -> np.ndarray:
    """Distinct slots < max_num_reqs, request i owned by rank i % tp, in a shuffled batch order."""
    per_rank = -(-num_reqs // tp)
    if per_rank * tp > max_num_reqs:
        raise ValueError(f"{num_reqs} requests at tp {tp} need a capacity of {per_rank * tp}, not {max_num_reqs}")
    columns = [rng.permutation(max_num_reqs // tp)[:per_rank] for _ in range(tp)]
    slots = np.array([columns[i % tp][i // tp] * tp + i % tp for i in range(num_reqs)], dtype=np.int64)
    return slots[rng.permutation(num_reqs)]


class ScaleShape(Bench):
    """One batch shape: the batch, one rank's vocab shard of the logits in ``dtype``, and the step calls.

    ``comm``: the group the sharders talk through; rank 0 of a ``LoopbackComm`` group when None (one
    device simulating the group), or a real group (``multi_rank.py``), whose ranks all build the same batch.
    """

    def __init__(
        self,
        num_reqs: int,
        rows: int,
        tp: int,
        vocab: int,
        dtype: str,
        *,
        capacity: tuple[int, int],
        num_logprobs: int,
        device: torch.device,
        comm=None,
    ):
        if vocab % tp:
            raise ValueError(f"vocab {vocab} is not divisible by tp {tp}")
        rng = np.random.default_rng(num_reqs * 10 + rows + 1000 * tp)
        self.tp, self.device, self.vocab, self.rows = tp, device, vocab, rows
        # The grid follows the default profile, whose owner rule needs no owner table.
        self.profile, self.shard_kwargs = DEFAULT_PROFILE, {}
        self.comm = comm if comm is not None else LoopbackComm(0, tp)
        self.num_reqs, self.dtype = num_reqs, DTYPES[dtype]
        self.batch = engine_batch(balanced_slots(num_reqs, tp, capacity[0], rng), [rows] * num_reqs, device)
        self.dims = (num_logprobs, 0)
        self.capacity = capacity
        self.num_logits = num_reqs * rows
        gen = torch.Generator(device=device).manual_seed(num_reqs + vocab + 7919 * self.comm.rank)
        self.logits_shard = torch.randn(self.num_logits, vocab // tp, device=device, dtype=self.dtype, generator=gen)
        plan = self.sharder("production").shard_sampler_inputs(self.batch, None)
        self.num_local_reqs = plan.metadata.num_local_reqs
        self.num_local_logits = plan.metadata.num_local_logits

    def sharder(self, impl: str, **options):
        return IMPLS[impl](*self.capacity, comm=self.comm, device=self.device, **options)

    def step_call(self, impl: str) -> Callable[[], object]:
        """Shard + all-to-all + gather with logprobs and NaN counts (as bench_step.py's step)."""
        return self.calls(self.sharder(impl))["step"]

    def sharded_sampling_step(self, sampler, sharder=None) -> Callable[[], object]:
        """Shard, all-to-all, sample the local rows, gather the sampled ids (no logprobs)."""
        sharder = sharder or self.sharder("production")
        plan = sharder.shard_sampler_inputs(self.batch, None)
        num_local = plan.metadata.num_local_reqs
        ones = torch.full((num_local,), self.rows, dtype=torch.int32, device=self.device)
        zeros = torch.zeros(num_local, dtype=torch.int32, device=self.device)

        def sample(local_logits, shard):
            tokens = sampler(local_logits).view(num_local, self.rows)
            return SamplerOutput(sampled_token_ids=tokens, num_sampled=ones, num_rejected=zeros)

        def step():
            return engine_step(sharder, self.batch, None, lambda shard: self.logits_shard, sample)

        return step

    def replicated_sampling_step(self, sampler) -> Callable[[], object]:
        """All-gather the full logits (a fresh [L, V] per step, as engines gather), sample every row."""
        comm, tp, shard = self.comm, self.tp, self.logits_shard
        width = shard.shape[1]

        def step():
            gathered = torch.empty((tp * shard.shape[0], width), dtype=shard.dtype, device=self.device)
            comm.all_gather_into_tensor(gathered, shard)
            full = gathered.view(tp, shard.shape[0], width).permute(1, 0, 2).reshape(shard.shape[0], tp * width)
            return sampler(full)

        return step


def implementations() -> list[str]:
    """Production, and vLLM's file where add_upstream registered it."""
    return [name for name in ("production", "upstream") if name in IMPLS]


def burst_size(fn: Callable[[], object], device: torch.device, target_s: float) -> int:
    """Calls per timed burst so that one burst lasts about ``target_s`` (after two warm-up calls)."""
    fn()
    fn()
    one = burst_us(fn, device, 1) / 1e6
    return max(1, min(200, int(target_s / max(one, 1e-7))))


def interleave(
    calls: dict[str, Callable[[], object]],
    device: torch.device,
    rounds: int,
    target_s: float,
    agree: Callable[[float], float] = lambda value: value,
) -> dict[str, list[float]]:
    """Per-call wall us of each call per round; within a round the calls alternate (A B, then B A).

    ``agree(value)``: the group's value for this rank's (the maximum over ranks, in a real group, whose
    ranks must make the same number of calls and wait for the slowest); the value itself on one device.
    """
    bursts = {name: int(agree(burst_size(fn, device, target_s))) for name, fn in calls.items()}
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            times[name].append(agree(burst_us(calls[name], device, bursts[name])))
    return times


def spread(values: list[float]) -> dict:
    """Median and quartiles of ``values``."""
    if len(values) < 2:
        return {"median": values[0], "q1": values[0], "q3": values[0], "n": len(values)}
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": median, "q1": q1, "q3": q3, "n": len(values)}


def ratio_spread(numerator: list[float], denominator: list[float]) -> dict:
    """Spread of per-round ratios (both measured in the same round)."""
    return spread([a / b for a, b in zip(numerator, denominator, strict=True)])


def peak_step_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Bytes above what was allocated before one call of ``fn``, at the call's peak (CUDA only, else 0)."""
    if device.type != "cuda":
        return 0
    synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = fn()
    synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del result
    return peak


def allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
