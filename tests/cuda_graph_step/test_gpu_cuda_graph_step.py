"""On a CUDA device: examples/cuda_graph_step's replays equal production's eager step, batch after batch.

Skipped without a GPU. Two groups: rank 1 of a simulated tp-4 group (LoopbackComm, as the other GPU
tests), and a real NCCL group of one rank. Under LoopbackComm every peer sends what this rank sends,
so a request of another owner whose index among its owner's requests is past this rank's own count
reads a padding row of the captured wire but a zero row of the eager one: the simulated rank is made
the most loaded one (as bench/scale_shapes.py does), where the simulation is faithful.
test_cuda_graph_step.py checks the padded procedure in real multi-rank groups.
"""

import dataclasses
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from shardspec_cuda_graph import PAD_TOKEN_INDEX, CapturedSteps

from shardspec.comm import LoopbackComm, TorchDistComm
from shardspec.impl import ProductionSharder
from shardspec.spec.builders import build_input_batch
from shardspec.spec.model import LogprobsTensors, SamplerOutput, num_logprob_columns
from shardspec.spec.profiles import DEFAULT_PROFILE, rules_of

# The one-rank profile (vllm-0.33 and vllm-0.34 build no sharder of one rank: PRE-TP-SIZE), named here: the
# subprocess below imports this module without tests/ on its path.
VLLM_SEED = "vllm-seed"
# The subprocess below has no conftest: it is given the example's folder itself.
EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "cuda_graph_step"

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DIMS, VOCAB, CAPACITY = (3, 0), 256, (256, 4)


def _batch(num_reqs, tp, rank, max_rows, seed):
    """``num_reqs`` requests whose slots make ``rank`` own at least as many as any other rank."""
    rng = np.random.default_rng(seed)
    per_rank = -(-num_reqs // tp)
    owners = [rank] * per_rank + [r for r in range(tp) if r != rank for _ in range(per_rank)]
    owners = owners[:num_reqs]
    counts = {r: 0 for r in range(tp)}
    slots = []
    for owner in owners:
        slots.append(owner + tp * counts[owner])
        counts[owner] += 1
    slots = np.array(slots)[rng.permutation(num_reqs)]
    rows = rng.integers(1, max_rows + 1, size=num_reqs)
    return build_input_batch(slots, rows, device="cuda")


def _local_output(local_batch, width, seed):
    n, rows = local_batch.num_reqs, local_batch.num_logits
    gen = torch.Generator(device="cuda").manual_seed(seed)
    ints = dict(device="cuda", generator=gen)
    cols = num_logprob_columns(DIMS)
    return SamplerOutput(
        sampled_token_ids=torch.randint(0, 1000, (n, width), **ints),
        logprobs_tensors=LogprobsTensors(
            torch.randint(0, 1000, (rows, cols), **ints),
            torch.randn(rows, cols, **ints),
            torch.randint(0, 9, (rows,), **ints),
        ),
        num_nans=torch.randint(0, 3, (rows,), dtype=torch.int32, **ints),
        num_sampled=torch.randint(1, 4, (n,), dtype=torch.int32, **ints),
        num_rejected=torch.randint(0, 3, (n,), dtype=torch.int32, **ints),
    )


def _token_logits(batch, tp, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(max(1, int(batch.query_start_loc[-1])), VOCAB // tp, device="cuda", generator=gen)


def _snapshot(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(
            value, **{f.name: _snapshot(getattr(value, f.name)) for f in dataclasses.fields(value)}
        )
    if isinstance(value, tuple):
        items = [_snapshot(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


def _assert_equal(expected, actual, where):
    if isinstance(expected, torch.Tensor):
        assert expected.dtype == actual.dtype and expected.shape == actual.shape, where
        assert torch.equal(expected, actual), where
    elif isinstance(expected, np.ndarray):
        assert expected.dtype == actual.dtype and np.array_equal(expected, actual), where
    elif dataclasses.is_dataclass(expected):
        for f in dataclasses.fields(expected):
            _assert_equal(getattr(expected, f.name), getattr(actual, f.name), f"{where}.{f.name}")
    elif isinstance(expected, tuple):
        for k, (e, a) in enumerate(zip(expected, actual, strict=True)):
            _assert_equal(e, a, f"{where}[{k}]")
    else:
        assert expected == actual, f"{where}: {actual!r} != {expected!r}"


def _compare_steps(make_comm, batches, tp):
    """Each batch through the eager sharder and through the captured steps; every result compared."""
    comm = make_comm()
    # One rank: vllm-seed, since the default profile may build no one-rank sharder (PRE-TP-SIZE).
    profile = DEFAULT_PROFILE if tp >= rules_of(DEFAULT_PROFILE).min_tp else VLLM_SEED
    eager = ProductionSharder(*CAPACITY, comm=comm, device="cuda", rules=rules_of(profile))
    steps = CapturedSteps(
        *CAPACITY, comm=comm, vocab=VOCAB, device="cuda", gather_num_nans=True, logprobs_dims=DIMS, profile=profile
    )
    assert steps.graphs
    buckets = []
    for k, batch in enumerate(batches):
        x = _token_logits(batch, tp, seed=k)
        shard = eager.shard_sampler_inputs(batch, None)
        local_logits = eager.all_to_all_logits(x[shard.sorted_logits_indices], shard.metadata)
        out = _local_output(shard.local_batch, shard.metadata.max_num_logits_per_req, seed=k)
        gathered = eager.gather_sampler_output(
            out, shard.metadata, batch, shard.local_batch, gather_num_nans=True, logprobs_dims=DIMS
        )
        expected = _snapshot((shard.local_batch, shard.sorted_logits_indices, local_logits, gathered))

        plan = steps.shard(batch)
        assert plan._entry.graphs is not None  # replayed, not run eagerly
        # The engine's part: its vocab shard gathered into the static send buffer, its sampler's output.
        torch.index_select(x, 0, plan.sorted_logits_indices, out=plan.logits_input)
        c_logits = steps.all_to_all_logits(plan)
        c_gathered = steps.gather_sampler_output(plan, out)
        torch.cuda.synchronize()
        local_batch, sorted_indices, local_logits, gathered = expected
        where = f"batch {k} ({batch.num_reqs} requests, {plan.bucket})"
        _assert_equal(local_batch, plan.local_batch, f"{where} local batch")
        _assert_equal(local_logits, c_logits, f"{where} local logits")
        _assert_equal(gathered, c_gathered, f"{where} gathered")
        padded, start = plan.sorted_logits_indices.view(tp, -1), 0
        for r, count in enumerate(plan.num_logits_per_rank):
            assert torch.equal(padded[r, :count], sorted_indices[start : start + count]), where
            assert bool((padded[r, count:] == PAD_TOKEN_INDEX).all()), where
            start += count
        buckets.append(plan.bucket)
    return steps, buckets


def test_replays_equal_the_eager_step_within_and_across_buckets():
    # One rank of a loopback group reads its own rows where the others' would be: the rank must own at
    # least as many requests as any other, else it reads its own padding rows, which the captured step
    # leaves stale. Rank 0 does under either owner rule (by position it owns the most; by slot, _batch).
    tp, rank = 4, 0
    sizes = [64, 57, 49, 120, 9, 61, 64]  # bucket 16 x 4 three times, then 32, 4, and 16 again
    batches = [_batch(n, tp, rank, CAPACITY[1], seed=n) for n in sizes]
    steps, buckets = _compare_steps(lambda: LoopbackComm(rank, tp), batches, tp)
    per_rank = [bucket.reqs_per_rank for bucket in buckets]
    assert per_rank == [16, 16, 16, 32, 4, 16, 16]
    assert len(steps._entries) == len(set(buckets)) >= 3


def test_steady_state_step_never_waits_on_the_device():
    tp, rank = 4, 1
    steps = CapturedSteps(*CAPACITY, comm=LoopbackComm(rank, tp), vocab=VOCAB, device="cuda", gather_num_nans=True)
    first, second = _batch(40, tp, rank, 2, seed=1), _batch(37, tp, rank, 2, seed=2)
    steps.step(first)  # records the bucket
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        plan, local_logits, gathered = steps.step(second)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert plan.bucket == steps.bucket_for(first) and gathered.sampled_token_ids.shape == (37, 2)
    assert local_logits.shape == (plan.num_local_logits, VOCAB)


def _nccl_one_rank(store: str) -> None:
    """Run in a subprocess: the captured NCCL collectives keep destroy_process_group from returning, so the
    process exits without it once the comparison is done."""
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    batches = [_batch(n, 1, 0, 3, seed=n) for n in (100, 77, 128, 30, 250)]
    _, buckets = _compare_steps(lambda: TorchDistComm(), batches, 1)
    assert [bucket.reqs_per_rank for bucket in buckets] == [128, 128, 128, 32, 256]
    print("replays equal eager", flush=True)


def test_replays_equal_the_eager_step_in_a_one_rank_nccl_group(tmp_path):
    script = (
        "import os, sys; sys.path[:0] = [sys.argv[1], sys.argv[3]]; import test_gpu_cuda_graph_step as t; "
        "t._nccl_one_rank(sys.argv[2]); os._exit(0)"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    command = [sys.executable, "-c", script, here, str(tmp_path / "store"), str(EXAMPLE)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and "replays equal eager" in done.stdout, done.stdout + done.stderr
