"""examples/cuda_graph_step piece by piece: wire bytes, buckets and their entries, static buffers, device choice,
checks, cached views, recording. test_cuda_graph_step.py compares whole steps with the eager step."""

import contextlib
import gc

import numpy as np
import pytest
import shardspec_cuda_graph as captured
import torch
from impl_steps import DEVICE, assert_same
from shardspec_cuda_graph import Bucket, CapturedSteps, wire_bytes

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.spec.builders import build_input_batch
from shardspec.spec.errors import PreconditionError
from shardspec.spec.layouts import BATCH_TENSORS
from shardspec.spec.model import LogprobsTensors, SamplerOutput

META = torch.device("meta")
CAPACITY = (5, 3)  # tp 2: a rank owns at most 3 slots, so the largest bucket is (4, 4)


def _steps(rank=0, tp=2, **kw):
    return CapturedSteps(*CAPACITY, comm=LoopbackComm(rank, tp), vocab=8, device=kw.pop("device", DEVICE), **kw)


# -- wire bytes ---------------------------------------------------------------------------------


def test_wire_bytes_counts_every_chunk_of_an_uneven_batch():
    # tp 4, vocab 64 in bfloat16: a shard row is 16 values of 2 bytes. Bucket (4, 2): R = 8 rows per rank.
    rows, reqs, shard = [5, 3, 0, 2], [3, 2, 0, 1], 16 * 2
    got = wire_bytes(rows, reqs, 2, Bucket(4, 2), vocab=64, itemsize=2)
    assert got == {
        "a2a_send_unpadded": 10 * shard,
        "a2a_send_padded": 4 * 8 * shard,
        "a2a_receive_unpadded": 4 * 5 * shard,  # rank 0 receives its 5 rows from each of 4 ranks
        "a2a_receive_padded": 4 * 8 * shard,
        "a2a_group_unpadded": 4 * 10 * shard,
        "a2a_group_padded": 4 * 4 * 8 * shard,
        # per request: its W = 2 ids, num_sampled, num_rejected, num_nans, 8 bytes each, from 4 ranks
        "gather_receive_unpadded": 4 * 3 * (2 + 3) * 8,
        "gather_receive_padded": 4 * 4 * (2 + 3) * 8,
    }
    assert all(type(v) is int for v in got.values())
    at_rank_1 = wire_bytes(rows, reqs, 2, Bucket(4, 2), vocab=64, itemsize=2, rank=1)
    assert at_rank_1["a2a_receive_unpadded"] == 4 * 3 * shard


@pytest.mark.parametrize("num_logprobs", [0, 5])
def test_wire_bytes_of_the_logprobs(num_logprobs):
    """C = num_logprobs + 1 columns per row: C + 1 int64 ids (the selected rank last) and C float32 values."""
    cols = num_logprobs + 1
    per_row = (cols + 1) * 8 + cols * 4
    plain = wire_bytes([5, 3], [3, 2], 2, Bucket(4, 2), vocab=8, itemsize=4)
    got = wire_bytes([5, 3], [3, 2], 2, Bucket(4, 2), vocab=8, itemsize=4, num_logprobs=num_logprobs)
    assert got["gather_receive_unpadded"] == plain["gather_receive_unpadded"] + 2 * 3 * 2 * per_row
    assert got["gather_receive_padded"] == plain["gather_receive_padded"] + 2 * 4 * 2 * per_row


# -- construction: vocab, device, graphs ------------------------------------------------------------


def test_a_vocab_that_tp_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="vocab 9 is not divisible by tp 2"):
        CapturedSteps(*CAPACITY, comm=LoopbackComm(0, 2), vocab=9)


def test_a_cuda_device_is_pinned_to_the_current_one_and_records_graphs_by_default(monkeypatch):
    """No CUDA is needed to check the choices: the sharder and the graph pool are stand-ins here."""
    made = []

    class Sharder:  # would allocate its workspace on the device
        def __init__(self, *args, **kwargs):
            made.append((args, kwargs))

    pool = object()
    monkeypatch.setattr(captured, "ProductionSharder", Sharder)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: pool)
    comm = LoopbackComm(0, 2)
    steps = CapturedSteps(*CAPACITY, comm=comm, vocab=8, device="cuda")
    assert steps.device == torch.device("cuda", 3) and steps.graphs is True and steps._pool is pool
    # One sharder for every bucket: room for the largest capture batch (2 ranks x 4 requests), checks off.
    ((args, kwargs),) = made
    assert args == (8, 4) and kwargs["comm"] is comm and kwargs["device"] == torch.device("cuda", 3)
    assert not kwargs["check_preconditions"]
    made.clear()
    pinned = CapturedSteps(*CAPACITY, comm=comm, vocab=8, device="cuda:1", graphs=False)
    assert pinned.device == torch.device("cuda", 1) and pinned.graphs is False and pinned._pool is None
    assert made[0][1]["device"] == torch.device("cuda", 1)


# -- buckets and their entries ------------------------------------------------------------------


def _batch(slots, rows):
    return build_input_batch(slots, rows, device=DEVICE)


def test_the_largest_bucket_holds_a_full_batch():
    steps = _steps()
    assert steps.max_bucket == Bucket(4, 4)  # ceil(5 / 2) = 3 slots per rank, widths up to 3
    full = _batch([0, 1, 2, 3, 4], [3, 1, 2, 3, 1])  # rank 0 owns slots 0, 2, 4
    assert steps.bucket_for(full) == Bucket(4, 4)
    plan = steps.shard(full, steps.max_bucket)  # a capture batch of 8 requests, more than the capacity's 5
    assert plan.num_reqs_per_rank == [3, 2] and plan.num_logits_per_rank == [6, 4]
    eager = ProductionSharder(*CAPACITY, comm=LoopbackComm(0, 2), device=DEVICE).shard_sampler_inputs(full, None)
    assert_same(eager.local_batch, plan.local_batch, "local batch")


def test_a_batch_that_fills_a_bucket_exactly_fits_it():
    steps = _steps()
    plan = steps.shard(_batch([0, 1, 2, 3], [2, 2, 2, 2]), Bucket(2, 2))
    assert plan.bucket == Bucket(2, 2) and plan.num_logits_per_rank == [4, 4]


@pytest.mark.parametrize("bucket", [Bucket(0, 1), Bucket(1, 0), Bucket(8, 1), Bucket(1, 8)])
def test_a_bucket_outside_the_capacity_is_refused(bucket):
    steps = _steps()
    with pytest.raises(ValueError, match="exceeds the capacity's largest bucket"):
        steps.prepare(bucket)
    assert steps._entries == {}


def test_a_bucket_is_recorded_once_and_serves_every_batch_that_fits():
    steps = _steps()
    steps.prepare(Bucket(2, 2))
    entry = steps._entries[Bucket(2, 2)]
    first = steps.shard(_batch([0, 1, 2], [1, 2, 1]))
    second = steps.shard(_batch([3, 4], [2, 2]), Bucket(2, 2))
    assert first._entry is entry and second._entry is entry and list(steps._entries) == [Bucket(2, 2)]


def test_a_step_of_local_shapes_seen_before_reuses_their_views():
    steps = _steps()
    bucket = Bucket(2, 2)
    first = steps.shard(_batch([0, 1, 2], [1, 2, 1]), bucket)  # rank 0: 2 requests, 2 rows
    other = steps.shard(_batch([0, 3], [2, 1]), bucket)  # rank 0: 1 request, 2 rows
    again = steps.shard(_batch([4, 2, 1], [1, 1, 1]), bucket)  # rank 0: 2 requests, 2 rows
    assert other.local_batch.idx_mapping is not first.local_batch.idx_mapping
    for name in ("idx_mapping", "seq_lens", "cu_num_logits", "logits_indices", "expanded_idx_mapping"):
        assert getattr(again.local_batch, name) is getattr(first.local_batch, name), name


def test_the_cache_of_views_never_holds_more_than_its_bound():
    cache, bound = {}, captured._MAX_CACHED_VIEWS
    for key in range(3 * bound):
        value = object()
        captured._remember(cache, key, value)
        assert cache[key] is value and len(cache) <= bound


# -- static buffers -----------------------------------------------------------------------------


@pytest.fixture
def float64_by_default():
    """An engine may load its model under another default dtype; the buffers must not follow it."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.mark.parametrize("logprobs_dims, gather_num_nans", [((2, 0), True), (None, False)])
def test_static_buffers_are_on_the_step_device_with_the_data_model_dtypes(
    logprobs_dims, gather_num_nans, float64_by_default
):
    """The meta device allocates nothing; a buffer made on another device, or of another dtype, shows."""
    steps = _steps(
        device=META, logits_dtype=torch.bfloat16, logprobs_dims=logprobs_dims, gather_num_nans=gather_num_nans
    )
    steps.prepare(Bucket(2, 4))  # P = 2, W = 4, R = 8: a capture batch of 4 requests of 4 rows
    entry = steps._entries[Bucket(2, 4)]
    tensors = {name: value for name, value in vars(entry).items() if isinstance(value, torch.Tensor)}
    assert set(tensors) == {"slots", "cu", "logits_indices", "seq_lens", "positions", "position_owners", "logits_input"}
    assert {t.device for t in tensors.values()} == {META}
    assert entry.logits_input.dtype == torch.bfloat16 and entry.logits_input.shape == (16, 4)
    # The capture batch: as the data model's builder lays out 4 requests of 4 rows (slots 0..3).
    capture, model = entry.capture_batch, build_input_batch(range(4), [4] * 4, device=META)
    for name in BATCH_TENSORS:
        ours, theirs = getattr(capture, name), getattr(model, name)
        assert (ours.device, ours.dtype, ours.shape) == (theirs.device, theirs.dtype, theirs.shape), name
    for name in ("idx_mapping_np", "cu_num_logits_np"):
        ours, theirs = getattr(capture, name), getattr(model, name)
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs), name
    # The local output a sampler may write in place: P requests of W ids, R rows.
    out = entry.local_output
    expected = {
        "sampled_token_ids": ((2, 4), torch.int64),
        "num_sampled": ((2,), torch.int32),
        "num_rejected": ((2,), torch.int32),
    }
    if gather_num_nans:
        expected["num_nans"] = ((8,), torch.int32)
    else:
        assert out.num_nans is None
    if logprobs_dims is None:
        assert out.logprobs_tensors is None
    else:
        lp = out.logprobs_tensors
        expected |= {"logprob_token_ids": ((8, 3), torch.int64), "logprobs": ((8, 3), torch.float32)}
        expected["selected_token_ranks"] = ((8,), torch.int64)
    for name, (shape, dtype) in expected.items():
        value = getattr(out, name) if hasattr(out, name) else getattr(lp, name)
        assert (value.device, value.shape, value.dtype) == (META, shape, dtype), name


# -- checks -------------------------------------------------------------------------------------


def test_checks_are_on_by_default_and_name_the_rank():
    steps = _steps(rank=1)
    duplicate = _batch([0, 2], [1, 1])
    duplicate.idx_mapping_np[1] = 0  # host copy only: a slot twice
    duplicate.idx_mapping[1] = 0
    with pytest.raises(PreconditionError) as caught:
        steps.shard(duplicate)
    assert caught.value.rank == 1 and caught.value.precondition_id.startswith("PRE-SLOT")
    # With the checks off, the guards still refuse what would overrun the buffers, naming the rank.
    unchecked = _steps(rank=1, check_preconditions=False)
    unchecked.shard(duplicate)
    recorded = set(unchecked._entries)
    with pytest.raises(PreconditionError) as caught:
        unchecked.shard(_batch([0, 1], [4, 1]))
    assert caught.value.rank == 1 and caught.value.precondition_id == "PRE-CAPACITY-LOGITS"
    assert set(unchecked._entries) == recorded


def test_device_copies_are_compared_unless_turned_off():
    batch = _batch([0, 1, 2], [1, 1, 1])
    batch.idx_mapping[0] = 4  # the device copy disagrees with the host copy
    with pytest.raises(PreconditionError) as caught:  # by default only where that needs no wait: say so
        _steps(rank=1, check_device_copies=True).shard(batch)
    assert caught.value.precondition_id == "PRE-HOST-DEVICE-MATCH" and caught.value.rank == 1
    plan = _steps(check_device_copies=False).shard(batch)
    assert plan.num_reqs_per_rank == [2, 1]  # planned from the host copies


def _local_output(n, rows, **fields):
    ints = dict(dtype=torch.int32, device=DEVICE)
    out = dict(
        sampled_token_ids=torch.zeros((n, 2), dtype=torch.int64, device=DEVICE),
        logprobs_tensors=LogprobsTensors(
            torch.zeros((rows, 3), dtype=torch.int64, device=DEVICE),
            torch.zeros(rows, 3, device=DEVICE),
            torch.zeros(rows, dtype=torch.int64, device=DEVICE),
        ),
        num_nans=torch.zeros(rows, **ints),
        num_sampled=torch.ones(n, **ints),
        num_rejected=torch.zeros(n, **ints),
    )
    return SamplerOutput(**(out | fields))


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(num_nans=None), "num_nans"),
        (dict(num_sampled=torch.ones(5, dtype=torch.int32, device=DEVICE)), "num_sampled"),
        (dict(logprobs_tensors=LogprobsTensors(*[torch.zeros((1, 3), device=DEVICE)] * 2, None)), "logprob_token_ids"),
    ],
)
def test_a_local_output_is_checked_before_it_is_staged(fields, field):
    steps = _steps(rank=1, gather_num_nans=True, logprobs_dims=(2, 0))
    plan = steps.shard(_batch([0, 1, 3, 4], [1, 2, 1, 1]))  # rank 1: 2 requests, 3 rows
    assert (plan.num_local_reqs, plan.num_local_logits) == (2, 3)
    with pytest.raises(PreconditionError) as caught:
        steps.gather_sampler_output(plan, _local_output(2, 3, **fields))
    error = caught.value
    assert (error.precondition_id, error.field, error.rank) == ("PRE-LOCAL-OUTPUT", field, 1)


# -- recording -------------------------------------------------------------------------------------


def test_graphs_are_captured_with_garbage_collected_before_and_none_during(monkeypatch):
    """CUDA streams and graphs are stand-ins here: what is checked is when garbage may be collected."""
    collected, during = [], []

    class Stream:
        def __init__(self, device=None):
            pass

        def wait_stream(self, other):
            pass

    @contextlib.contextmanager
    def capture(graph, pool=None):
        during.append(gc.isenabled())
        yield

    steps = _steps(device="cpu", graphs=False)
    entry = steps._entry(steps.max_bucket)
    monkeypatch.setattr(gc, "collect", lambda *args: collected.append(len(during)))
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", object)
    monkeypatch.setattr(torch.cuda, "graph", capture)
    assert gc.isenabled()
    entry.record(True)
    assert collected == [0] and during == [False, False, False] and gc.isenabled()
    assert len(entry.graphs) == 3
