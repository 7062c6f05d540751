"""On a CUDA device: a production step never waits on the device, and replays from a CUDA graph.

Skipped without a GPU. The sampler is replaced by a synthetic local output made
on the device, so the step itself is all that runs under the sync check.
"""

import numpy as np
import pytest
import torch

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.reference import ReferenceSharder
from shardspec.spec.builders import build_grammar_output, build_input_batch
from shardspec.spec.model import PROFILES, LogprobsTensors, SamplerOutput, admitted_cu_num_logits
from shardspec.spec.profiles import DEFAULT_PROFILE, rules_of

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

TP, RANK, DIMS, VOCAB = 4, 1, (5, 2), 512


def _inputs(num_reqs, seed, with_grammar=True, profile=DEFAULT_PROFILE):
    """What the profile's engine passes: vllm-seed one bitmask row per logits row; vllm-0.33 and later
    admitted draft counts, seq_lens_cpu_upper_bound and grammar blocks of 4 rows (with acceptable-draft
    counts where the grammar output has them)."""
    rules = rules_of(profile)
    rng = np.random.default_rng(seed)
    slots, rows = rng.permutation(256)[:num_reqs], rng.integers(1, 5, size=num_reqs)
    admitted = rng.integers(0, rows).tolist() if rules.admits_drafts else None
    bound = rules.has_upper_bound
    batch = build_input_batch(slots, rows, device="cuda", admitted_drafts=admitted, seq_lens_upper_bound=bound)
    grammar = None
    if with_grammar:
        listed = rng.permutation(num_reqs)[: num_reqs // 2].tolist()
        counts = rng.integers(0, 4, size=len(listed)).tolist() if rules.acceptable_drafts == "sliced" else None
        block_rows = 4 if rules.grammar_blocks else None
        grammar = build_grammar_output(
            batch, listed, VOCAB, seed=seed, block_rows=block_rows, num_acceptable_drafts=counts
        )
    logits_shard = torch.randn(int(admitted_cu_num_logits(batch)[-1]), VOCAB // TP, device="cuda")
    return batch, grammar, logits_shard


def _local_output(local_batch, seed=0):
    """A sampler's result for ``local_batch``, made on the device (no host round trip)."""
    n, rows = local_batch.num_reqs, local_batch.num_logits
    gen = torch.Generator(device="cuda").manual_seed(seed)
    ints = dict(device="cuda", generator=gen)
    return SamplerOutput(
        sampled_token_ids=torch.randint(0, 1000, (n, 3), **ints),
        logprobs_tensors=LogprobsTensors(
            torch.randint(0, 1000, (rows, 4), **ints),
            torch.randn(rows, 4, **ints),
            torch.randint(0, 9, (rows,), **ints),
        ),
        num_nans=torch.randint(0, 3, (rows,), dtype=torch.int32, **ints),
        num_sampled=torch.randint(1, 4, (n,), dtype=torch.int32, **ints),
        num_rejected=torch.randint(0, 3, (n,), dtype=torch.int32, **ints),
    )


def _owner_options(profile, batch, seed):
    """The step's owner table where the profile's owner rule reads one: an engine's after some steps (half
    of the batch's slots rewritten to their positions mod tp, the rest still slot mod tp)."""
    if not rules_of(profile).owner_by_table:
        return {}
    table = np.arange(256) % TP
    rewritten = np.random.default_rng(seed).permutation(batch.num_reqs)[: batch.num_reqs // 2]
    table[np.asarray(batch.idx_mapping_np)[rewritten]] = rewritten % TP
    return {"owner_table": table}


def _step(sharder, batch, grammar, logits_shard, output=None, **options):
    shard = sharder.shard_sampler_inputs(batch, grammar, **options)
    full = sharder.all_to_all_logits(logits_shard, shard.metadata)
    output = _local_output(shard.local_batch) if output is None else output
    gathered = sharder.gather_sampler_output(
        output, shard.metadata, batch, shard.local_batch, gather_num_nans=True, logprobs_dims=DIMS
    )
    return shard, full, output, gathered


def _assert_gathered_equal(expected, actual):
    for name in ("sampled_token_ids", "num_sampled", "num_rejected", "num_nans"):
        e, a = getattr(expected, name), getattr(actual, name)
        assert e.dtype == a.dtype and torch.equal(e, a), name
    for e, a in zip(expected.logprobs_tensors, actual.logprobs_tensors, strict=False):
        assert e == a if not isinstance(e, torch.Tensor) else (e.dtype == a.dtype and torch.equal(e, a))


@pytest.mark.parametrize("profile", PROFILES)
def test_whole_step_has_no_device_to_host_sync(profile):
    """vllm-0.33 with everything vLLM 0.33 passes, adaptive verification included."""
    options = dict(rules=rules_of(profile), adaptive_verification_enabled=rules_of(profile).adaptive)
    sharder = ProductionSharder(256, 4, comm=LoopbackComm(RANK, TP), device="cuda", **options)
    warm = _inputs(40, seed=1, profile=profile)
    _step(sharder, *warm, **_owner_options(profile, warm[0], 1))  # compiles the kernels outside the check
    batch, grammar, logits_shard = _inputs(97, seed=2, profile=profile)
    table = _owner_options(profile, batch, 2)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        shard, full, output, gathered = _step(sharder, batch, grammar, logits_shard, **table)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    reference = ReferenceSharder(256, 4, comm=LoopbackComm(RANK, TP), device="cuda", **options)
    ref_shard, ref_full, _, ref_gathered = _step(reference, batch, grammar, logits_shard, output, **table)
    assert torch.equal(shard.sorted_logits_indices, ref_shard.sorted_logits_indices)
    assert torch.equal(shard.local_grammar_output.grammar_bitmask, ref_shard.local_grammar_output.grammar_bitmask)
    assert torch.equal(full, ref_full)
    _assert_gathered_equal(ref_gathered, gathered)


def test_step_replays_from_a_cuda_graph():
    """Fixed shapes, no grammar: shard + all-to-all + gather captured once and replayed."""
    batch, _, logits_shard = _inputs(44, seed=3, with_grammar=False)
    sharder = ProductionSharder(256, 4, comm=LoopbackComm(RANK, TP), device="cuda")
    eager = _step(sharder, batch, None, logits_shard)
    output = eager[2]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _step(sharder, batch, None, logits_shard, output)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, captured_full, _, captured = _step(sharder, batch, None, logits_shard, output)
    for tensor in (captured.sampled_token_ids, captured.num_sampled, captured_full):
        tensor.fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    expected = _step(
        ReferenceSharder(256, 4, comm=LoopbackComm(RANK, TP), device="cuda"), batch, None, logits_shard, output
    )
    assert torch.equal(captured_full, expected[1])
    _assert_gathered_equal(expected[3], captured)
