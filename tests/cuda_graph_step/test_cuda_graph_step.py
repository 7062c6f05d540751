"""examples/cuda_graph_step on the CPU: buckets, padded wire bytes, and the padded step run eagerly equals the
eager step.

Without CUDA, CapturedSteps runs the same padded procedure it records on a GPU (the Triton interpreter
here), so equality with ProductionSharder in real in-process groups (LockstepGroup) checks the padded
wire itself: the padded send layout, the padding requests, the trimmed views. test_gpu_cuda_graph_step.py
checks the replays.
"""

import dataclasses

import numpy as np
import pytest
import torch
from bundled import profile_for_tp
from impl_steps import DEVICE, assert_same
from shardspec_cuda_graph import PAD_TOKEN_INDEX, Bucket, CapturedSteps, bucket_for, wire_bytes

from shardspec.comm import LockstepGroup, LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.spec.builders import build_input_batch
from shardspec.spec.model import DEFAULT_PROFILE, LogprobsTensors, SamplerOutput, num_logprob_columns, rules_of

DIMS, VOCAB, CAPACITY = (2, 0), 12, (24, 3)


def test_bucket_for_rounds_each_count_up_to_a_power_of_two():
    assert bucket_for([75, 75, 74, 75], 1) == Bucket(128, 1)
    assert bucket_for([128] * 8, 1) == Bucket(128, 1)
    assert bucket_for([3, 0], 3) == Bucket(4, 4)
    assert bucket_for([0, 0], 1) == Bucket(1, 1)  # an empty batch still has a bucket
    assert Bucket(4, 4).rows_per_rank == 16


def test_wire_bytes_host_bound_shape_and_a_padded_one():
    # tp 8, 1024 requests of 1 row, vocab 32768, float32: 128 rows per rank fill the bucket exactly.
    exact = wire_bytes([128] * 8, [128] * 8, 1, Bucket(128, 1), vocab=32768, itemsize=4, num_logprobs=20)
    assert exact["a2a_send_unpadded"] == exact["a2a_send_padded"] == 1024 * 4096 * 4
    assert exact["a2a_group_padded"] == 8 * 1024 * 4096 * 4
    assert exact["gather_receive_unpadded"] == exact["gather_receive_padded"]
    # 600 requests: 75 per rank in a bucket of 128.
    padded = wire_bytes([75] * 8, [75] * 8, 1, Bucket(128, 1), vocab=32768, itemsize=4)
    assert padded["a2a_send_unpadded"] == 600 * 4096 * 4
    assert padded["a2a_send_padded"] == 1024 * 4096 * 4
    assert padded["a2a_receive_unpadded"] == 8 * 75 * 4096 * 4
    assert padded["gather_receive_padded"] == 8 * 128 * 4 * 8
    assert padded["gather_receive_unpadded"] == 8 * 75 * 4 * 8


def _batch(slots, rows, seed):
    rng = np.random.default_rng(seed)
    return build_input_batch(slots, rows, seq_lens=rng.integers(1, 50, size=len(slots)), device=DEVICE)


def _local_output(local_batch, width, seed, cols=None):
    """What a sampler returns for ``local_batch``: right shapes, values seeded by the request's slot;
    ``cols`` logprob columns (default: the agreed width of DIMS)."""
    n, rows = local_batch.num_reqs, local_batch.num_logits
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    cols = num_logprob_columns(DIMS) if cols is None else cols
    on = dict(generator=gen, device=DEVICE)
    return SamplerOutput(
        sampled_token_ids=torch.randint(0, 1000, (n, width), **on),
        logprobs_tensors=LogprobsTensors(
            torch.randint(0, 1000, (rows, cols), **on),
            torch.randn(rows, cols, **on),
            torch.randint(0, 9, (rows,), **on),
        ),
        num_nans=torch.randint(0, 3, (rows,), dtype=torch.int32, **on),
        num_sampled=torch.randint(1, 4, (n,), dtype=torch.int32, **on),
        num_rejected=torch.randint(0, 3, (n,), dtype=torch.int32, **on),
    )


def _profile(tp: int) -> str:
    """The default profile where it builds a sharder for ``tp`` ranks, else vllm-seed (vllm-0.33 and vllm-0.34
    build none of one rank: PRE-TP-SIZE)."""
    return profile_for_tp(tp)


def _eager_steps(comm, batches, vocab_shard, plain=False):
    """The eager step per batch; ``plain``: without logprobs and NaN counts, and without the padded order."""
    sharder = ProductionSharder(*CAPACITY, comm=comm, device=DEVICE, rules=rules_of(_profile(comm.world_size)))
    make_output = _plain_output if plain else _local_output
    options = {} if plain else {"gather_num_nans": True, "logprobs_dims": DIMS}
    results = []
    for k, batch in enumerate(batches):
        shard = sharder.shard_sampler_inputs(batch, None)
        x = _token_logits(batch, comm.rank, k, vocab_shard)
        local_logits = sharder.all_to_all_logits(x[shard.sorted_logits_indices], shard.metadata)
        out = make_output(shard.local_batch, shard.metadata.max_num_logits_per_req, seed=k * 7 + comm.rank)
        gathered = sharder.gather_sampler_output(out, shard.metadata, batch, shard.local_batch, **options)
        order = () if plain else (shard.sorted_logits_indices,)
        results.append(_snapshot((shard.local_batch, *order, local_logits, gathered)))
    return results


def _captured_steps(comm, batches, vocab_shard):
    # Ranks are threads here: the padded procedure runs eagerly, graphs or not (tests/gpu replays them).
    steps = CapturedSteps(
        *CAPACITY,
        comm=comm,
        vocab=vocab_shard * comm.world_size,
        device=DEVICE,
        gather_num_nans=True,
        logprobs_dims=DIMS,
        graphs=False,
        profile=_profile(comm.world_size),
    )
    results = []
    for k, batch in enumerate(batches):
        plan = steps.shard(batch)
        x = _token_logits(batch, comm.rank, k, vocab_shard)
        local_logits = steps.all_to_all_logits(plan, x[plan.sorted_logits_indices])
        out = _local_output(plan.local_batch, plan.width, seed=k * 7 + comm.rank)
        gathered = steps.gather_sampler_output(plan, out)
        # Views of buffers the next step overwrites: kept as copies.
        results.append((plan, *_snapshot((plan.local_batch, plan.sorted_logits_indices, local_logits, gathered))))
    return results


def _snapshot(value):
    """Copies of every tensor in ``value`` (tuples, named tuples, dataclasses), the rest as it is."""
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


def _token_logits(batch, rank, seed, vocab_shard):
    # At least one token: padding rows point at token PAD_TOKEN_INDEX, also in an empty batch.
    tokens = max(1, int(batch.query_start_loc[-1]))
    gen = torch.Generator(device=DEVICE).manual_seed(seed * 131 + rank)
    return torch.randn(tokens, vocab_shard, generator=gen, device=DEVICE)


def _batches(tp, seed):
    """Batches of different sizes and widths (different buckets), then an empty one."""
    rng = np.random.default_rng(seed)
    sizes = [2 * tp, 2 * tp - 1, 5 * tp - 2, 3, 0]
    out = []
    for k, n in enumerate(sizes):
        rows = rng.integers(1, 3, size=n) if k != 1 else np.full(n, 3)
        out.append(_batch(rng.permutation(CAPACITY[0])[:n], rows, seed + k))
    return out


@pytest.mark.parametrize("tp", [1, 2, 3])
def test_padded_step_equals_the_eager_step_in_a_group(tp):
    batches = _batches(tp, seed=tp)
    vocab_shard = VOCAB // tp
    eager = LockstepGroup(tp, timeout_s=120).run(_eager_steps, batches, vocab_shard)
    captured = LockstepGroup(tp, timeout_s=120).run(_captured_steps, batches, vocab_shard)
    buckets = set()
    for rank in range(tp):
        for k, (expected, (plan, c_local_batch, c_sorted, c_logits, c_gathered)) in enumerate(
            zip(eager[rank], captured[rank], strict=True)
        ):
            local_batch, sorted_indices, local_logits, gathered = expected
            where = f"rank {rank} batch {k}"
            buckets.add(plan.bucket)
            assert_same(local_batch, c_local_batch, f"{where} local batch")
            assert_same(local_logits, c_logits, f"{where} local logits")
            assert_same(gathered, c_gathered, f"{where} gathered")
            # The padded order holds the eager order's rows, rank by rank, and marks the rest as padding.
            rows = plan.bucket.rows_per_rank
            padded = c_sorted.view(tp, rows)
            start = 0
            for r, count in enumerate(plan.num_logits_per_rank):
                assert torch.equal(padded[r, :count], sorted_indices[start : start + count]), where
                assert bool((padded[r, count:] == PAD_TOKEN_INDEX).all()), where
                start += count
    assert len(buckets) >= 3  # batches in one bucket, and across buckets


def test_one_bucket_serves_batches_that_fit_and_refuses_one_that_does_not():
    steps = CapturedSteps(*CAPACITY, comm=LoopbackComm(0, 2), vocab=VOCAB, device=DEVICE)
    small = _batch([0, 1, 2], [1, 1, 1], 0)
    assert steps.bucket_for(small) == Bucket(2, 1)
    plan = steps.shard(small, Bucket(4, 2))
    assert plan.bucket == Bucket(4, 2) and plan.logits_input.shape == (2 * 8, VOCAB // 2)
    big = _batch([0, 2, 4, 6, 8, 10, 12, 14, 16], [1] * 9, 1)  # rank 0 owns 5 (by position) or 9 (by slot)
    with pytest.raises(ValueError, match="does not fit"):
        steps.shard(big, Bucket(4, 2))
    with pytest.raises(ValueError, match="exceeds the capacity"):
        steps.shard(small, Bucket(32, 1))
    with pytest.raises(ValueError, match="padded wire"):
        steps.all_to_all_logits(plan, torch.zeros(3, VOCAB // 2, device=DEVICE))


def test_graphs_are_refused_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        CapturedSteps(*CAPACITY, comm=LoopbackComm(0, 2), vocab=VOCAB, graphs=True)
    assert CapturedSteps(*CAPACITY, comm=LoopbackComm(0, 2), vocab=VOCAB).graphs is False


def test_preconditions_are_checked_before_anything_is_staged():
    steps = CapturedSteps(*CAPACITY, comm=LoopbackComm(0, 2), vocab=VOCAB, device=DEVICE)
    with pytest.raises(Exception, match="PRE-SLOT-RANGE"):
        steps.shard(_batch([0, 99], [1, 1], 0))
    assert steps._entries == {}


# -- the defaults, inputs written in place, step(), checks off ---------------------------------

PLAIN = dict(gather_num_nans=False, logprobs_dims=None)  # both steps' defaults


def _plain_output(local_batch, width, seed):
    """A sampler's results without logprobs or NaN counts."""
    out = _local_output(local_batch, width, seed)
    return dataclasses.replace(out, logprobs_tensors=None, num_nans=None)


def _captured_plain(comm, batches, vocab_shard):
    """Checks off. Even batches: the engine writes plan.logits_input and the sampler plan.local_output in
    place. Odd batches: step() with the tensors given, in a bucket of twice the smallest's requests."""
    steps = CapturedSteps(
        *CAPACITY,
        comm=comm,
        vocab=vocab_shard * comm.world_size,
        device=DEVICE,
        check_preconditions=False,
        graphs=False,  # ranks are threads
    )
    results = []
    for k, batch in enumerate(batches):
        x = _token_logits(batch, comm.rank, k, vocab_shard)
        seed = k * 7 + comm.rank
        if k % 2:
            smallest = steps.bucket_for(batch)
            bucket = Bucket(2 * smallest.reqs_per_rank, smallest.rows_per_req)
            layout = steps.shard(batch, bucket)  # where the engine's rows go, and the local batch
            out = _plain_output(layout.local_batch, layout.width, seed)
            plan, local_logits, gathered = steps.step(batch, x[layout.sorted_logits_indices], out, bucket)
            assert plan.bucket == bucket
        else:
            plan = steps.shard(batch)
            plan.logits_input.copy_(x[plan.sorted_logits_indices])
            local_logits = steps.all_to_all_logits(plan)
            out = _plain_output(plan.local_batch, plan.width, seed)
            n, static = plan.num_local_reqs, plan.local_output
            static.sampled_token_ids[:n, : plan.width].copy_(out.sampled_token_ids)
            static.num_sampled[:n].copy_(out.num_sampled)
            static.num_rejected[:n].copy_(out.num_rejected)
            gathered = steps.gather_sampler_output(plan)
        # What the sampler may write: no NaN counts or logprobs are gathered, so none are offered.
        assert plan.local_output.num_nans is None and plan.local_output.logprobs_tensors is None
        results.append((plan, *_snapshot((plan.local_batch, local_logits, gathered))))
    return results


def test_inputs_written_in_place_and_step_with_the_checks_off_equal_the_eager_step():
    tp, vocab_shard = 2, VOCAB // 2
    seq = np.random.default_rng(5).integers(1, 50, size=CAPACITY[0])
    batches = [
        # slots, rows per request (the owners by the default profile's owner rule)
        ([0, 1, 2, 3], [2, 2, 2, 2]),  # fills bucket (2, 2): every rank sends R = 4 real rows
        ([5, 2, 7], [1, 2, 2]),
        ([4, 6, 1], [2, 1, 1]),  # bucket (2, 2) again, other local shapes
        ([4], [2]),  # rank 1 owns nothing
        ([9, 8, 11], [3, 1, 2]),  # width 3 in a bucket of 4: narrower ids
        ([10, 12, 14, 3], [1, 1, 1, 1]),
        ([], []),
    ]
    batches = [build_input_batch(s, r, seq_lens=seq[s], device=DEVICE) for s, r in batches]
    eager = LockstepGroup(tp, timeout_s=120).run(_eager_steps, batches, vocab_shard, True)
    captured = LockstepGroup(tp, timeout_s=120).run(_captured_plain, batches, vocab_shard)
    for rank in range(tp):
        for k, (expected, (plan, *actual)) in enumerate(zip(eager[rank], captured[rank], strict=True)):
            where = f"rank {rank} batch {k}"
            for name, e, a in zip(("local batch", "local logits", "gathered"), expected, actual, strict=True):
                assert_same(e, a, f"{where} {name}")
            owners = rules_of(DEFAULT_PROFILE).owners(batches[k].idx_mapping_np, tp)
            assert plan.num_reqs_per_rank == np.bincount(owners, minlength=tp).tolist(), where
    assert captured[0][0][0].bucket == captured[0][2][0].bucket == Bucket(2, 2)


# -- logprob columns as the sampler gives them ----------------------------------------------------


def _logprobs_of_width(comm, batch, widths, captured):
    """The gathered logprobs of ``batch`` step after step, the local sampler giving ``widths[k]`` logprob
    columns (None: no logprobs_tensors)."""
    kw = dict(comm=comm, device=DEVICE)
    steps = CapturedSteps(*CAPACITY, vocab=VOCAB, logprobs_dims=DIMS, graphs=False, **kw) if captured else None
    sharder = None if captured else ProductionSharder(*CAPACITY, **kw)
    results = []
    for k, cols in enumerate(widths):
        seed = k * 7 + comm.rank
        if captured:
            plan = steps.shard(batch)
            out = _local_output(plan.local_batch, plan.width, seed, cols or 1)
            out = out if cols else dataclasses.replace(out, logprobs_tensors=None)
            gathered = steps.gather_sampler_output(plan, out)
        else:
            shard = sharder.shard_sampler_inputs(batch, None)
            out = _local_output(shard.local_batch, shard.metadata.max_num_logits_per_req, seed, cols or 1)
            out = out if cols else dataclasses.replace(out, logprobs_tensors=None)
            gathered = sharder.gather_sampler_output(out, shard.metadata, batch, shard.local_batch, logprobs_dims=DIMS)
        results.append(_snapshot(gathered.logprobs_tensors))
    return results


def test_logprobs_narrower_wider_or_absent_are_padded_and_cut_as_the_eager_step_does():
    """The agreed width is C = 3: wider local logprobs are cut to it, narrower ones (and none at all) are
    padded with token 0 and logprob -inf, also where an earlier step of the bucket left its columns."""
    batch = _batch([0, 1, 2, 5, 7], [1, 2, 1, 3, 2], 3)
    widths = [4, 2, None, 3, 1]
    eager = LockstepGroup(2, timeout_s=120).run(_logprobs_of_width, batch, widths, False)
    captured = LockstepGroup(2, timeout_s=120).run(_logprobs_of_width, batch, widths, True)
    for rank in range(2):
        for k, (expected, actual) in enumerate(zip(eager[rank], captured[rank], strict=True)):
            assert_same(expected, actual, f"rank {rank}, local logprobs of width {widths[k]}")
    narrow = eager[0][1]
    assert bool((narrow.logprobs[:, 2] == float("-inf")).all()) and bool((narrow.logprob_token_ids[:, 2] == 0).all())


def test_with_the_checks_off_logprob_ids_and_values_of_different_widths_are_read_within_both():
    """Unchecked, a sampler's logprob ids and values may differ in width: the staging copies the columns
    both have and pads the rest with token 0 / logprob -inf, as the eager pack does where it reads within
    both (it reads the ids' width). Bucket (1, 2): R = 2 rows, fewer than the C = 3 columns. One rank in
    one thread: on a GPU this replays the recorded graphs."""
    comm, batch = LoopbackComm(0, 1), _batch([3], [2], 0)
    unchecked = dict(comm=comm, device=DEVICE, check_preconditions=False, profile=_profile(1))
    steps = CapturedSteps(*CAPACITY, vocab=VOCAB, logprobs_dims=DIMS, **unchecked)
    sharder = ProductionSharder(
        *CAPACITY, comm=comm, device=DEVICE, check_preconditions=False, rules=rules_of(_profile(1))
    )
    for ids_cols, vals_cols in [(3, 3), (2, 3), (3, 2)]:
        where, cols = f"ids {ids_cols} wide, values {vals_cols}", min(ids_cols, vals_cols)
        plan = steps.shard(batch)
        assert plan.bucket == Bucket(1, 2), where
        out = _local_output(plan.local_batch, plan.width, seed=ids_cols)
        lp = out.logprobs_tensors
        ids, values = lp.logprob_token_ids[:, :ids_cols], lp.logprobs[:, :vals_cols]
        out = dataclasses.replace(out, logprobs_tensors=LogprobsTensors(ids, values, lp.selected_token_ranks))
        got = steps.gather_sampler_output(plan, out).logprobs_tensors
        if ids_cols <= vals_cols:
            shard = sharder.shard_sampler_inputs(batch, None)
            eager = sharder.gather_sampler_output(out, shard.metadata, batch, shard.local_batch, logprobs_dims=DIMS)
            assert_same(eager.logprobs_tensors, got, where)
        assert torch.equal(got.logprob_token_ids[:, :cols], lp.logprob_token_ids[:, :cols]), where
        assert torch.equal(got.logprobs[:, :cols], lp.logprobs[:, :cols]), where
        assert bool((got.logprob_token_ids[:, cols:] == 0).all()), where
        assert bool((got.logprobs[:, cols:] == float("-inf")).all()), where
