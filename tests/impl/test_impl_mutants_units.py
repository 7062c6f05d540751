"""Parts of production the whole-step tests cannot see on the CPU: launches, placement, caches, bounds.

The direct launch is only taken on a GPU; here it is built from stand-ins for Triton's compiled
kernel and checked argument by argument. Placement is checked on the meta device, where a tensor
left on the CPU shows. A step repeated with the same shapes must find every view and launch
configuration cached, and a local output whose logprob ids are shorter than its values (with the
checks off) must not be read past its end.
"""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from bundled import VLLM_034_SHARDED_CACHE, VLLM_SEED
from impl_steps import DEVICE, assert_same
from test_impl_launch import Chain, _fake_run

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder, launch
from shardspec.impl import exchange as exchange_module
from shardspec.impl import sharder as sharder_module
from shardspec.impl.grammar import _to_device, local_grammar_output
from shardspec.impl.kernels import next_power_of_2
from shardspec.impl.workspace import carve, plan_layout
from shardspec.reference import ReferenceSharder
from shardspec.spec.builders import build_input_batch
from shardspec.spec.model import GrammarOutput, LogprobsTensors, SamplerOutput
from shardspec.spec.profiles import rules_of

# -- launches ---------------------------------------------------------------------------------


class Recorder:
    """Stands in for a launch function: keeps the positional arguments of every call."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)


@pytest.fixture
def stream(monkeypatch):
    """torch's current-stream query, which a CPU build lacks: device i's stream is 1000 + i."""
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 1000 + index, raising=False)


def _compiled(run):
    return SimpleNamespace(run=run, function="function", packed_metadata="metadata")


def test_direct_launch_passes_what_run_takes(stream, monkeypatch):
    """Without a known launcher layout: run(grid x, y, z, stream, function, metadata, 3 hooks, args, constexprs)."""
    import triton

    monkeypatch.setattr(triton, "__version__", "3.9.0")
    run = Recorder()
    direct = launch._direct_launch(_compiled(run), 3, (16, True))
    direct(5, ("a", 7))
    assert run.calls == [(5, 1, 1, 1003, "function", "metadata", None, None, None, "a", 7, 16, True)]


def test_bare_launch_passes_what_the_c_launcher_takes(stream, monkeypatch):
    """Triton 3.6's C launcher: grid, stream, function, cooperative and PDL flags, two scratch, metadata, three more."""
    import triton

    name = "shardspec_test_fake_driver_units"
    monkeypatch.delitem(__import__("sys").modules, name, raising=False)
    monkeypatch.delenv("SHARDSPEC_BARE_LAUNCH", raising=False)
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    run = _fake_run(name, launch._BARE_FORMAT)
    run.launch, run.launch_cooperative_grid, run.launch_pdl = Recorder(), "cooperative", "pdl"
    direct = launch._direct_launch(_compiled(run), 0, (4,))
    direct(2, ("x",))
    assert run.launch.calls == [
        (2, 1, 1, 1000, "function", "cooperative", "pdl", None, None, "metadata", None, None, None, "x", 4)
    ]


def test_bare_launch_needs_the_scratch_sizes_to_be_known(monkeypatch):
    """A launcher that does not say its scratch sizes may need scratch memory: it keeps run()."""
    import triton

    name = "shardspec_test_fake_driver_scratch"
    monkeypatch.delitem(__import__("sys").modules, name, raising=False)
    monkeypatch.delenv("SHARDSPEC_BARE_LAUNCH", raising=False)
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    for missing in ("global_scratch_size", "profile_scratch_size"):
        run = _fake_run(name, launch._BARE_FORMAT)
        delattr(run, missing)
        assert launch._bare_launch(run) is None, missing


class FakeKernel:
    """A Triton kernel as Launcher sees it: arg_names and kernel[grid](*args, **constexprs)."""

    arg_names = ["x", "n", "BLOCK"]

    def __init__(self, compiled):
        self.compiled, self.calls = compiled, []

    def __getitem__(self, grid):
        def launch_through_triton(*args, **constexprs):
            self.calls.append((grid, args, constexprs))
            return self.compiled

        return launch_through_triton


def test_launcher_launches_directly_after_the_first_launch(stream, monkeypatch):
    """The first launch of a key goes through Triton and keeps its compiled kernel; later ones call it."""
    import triton

    monkeypatch.setattr(triton, "__version__", "3.9.0")
    run = Recorder()
    kernel = FakeKernel(_compiled(run))
    launcher = launch.Launcher(kernel)
    launcher._knobs = SimpleNamespace(launch_enter_hook=Chain(), launch_exit_hook=None)
    launcher(4, (1, "f32"), ("tensor", 9), {"BLOCK": 64}, ("address", 9))
    assert kernel.calls == [((4,), ("tensor", 9), {"BLOCK": 64})] and run.calls == []
    launcher(6, (1, "f32"), ("tensor", 10), {"BLOCK": 64}, ("address", 10))
    assert len(kernel.calls) == 1
    assert run.calls == [(6, 1, 1, 1001, "function", "metadata", None, None, None, "address", 10, 64)]


def test_launcher_keeps_no_direct_launch_without_knobs_or_metadata():
    """Interpreted (no knobs), or a result that is not a compiled kernel: every launch goes through Triton."""
    kernel = FakeKernel(_compiled(Recorder()))
    launcher = launch.Launcher(kernel)
    launcher._knobs = None
    launcher(1, ("k",), ("t",), {"BLOCK": 1})
    launcher._knobs = SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    kernel.compiled = SimpleNamespace(run=None)  # no packed_metadata
    launcher(1, ("k",), ("t",), {"BLOCK": 1})
    kernel.compiled = _compiled(Recorder())
    launcher(1, ("k",), ("t",), {"n": 1, "BLOCK": 1, "x": 0})  # constexprs not last, in order
    assert launcher._direct == {} and len(kernel.calls) == 3


def test_runtime_knobs_only_where_triton_has_launch_hooks(monkeypatch):
    from triton import knobs

    with_hooks = SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    monkeypatch.setattr(knobs, "runtime", with_hooks)
    assert launch._runtime_knobs() is with_hooks
    monkeypatch.setattr(knobs, "runtime", SimpleNamespace())
    assert launch._runtime_knobs() is None


# -- placement --------------------------------------------------------------------------------

META = torch.device("meta")


def test_host_values_reach_the_requested_device():
    moved = _to_device(np.array([3, 1], dtype=np.int32), META)
    assert moved.device == META and moved.dtype == torch.int64 and moved.shape == (2,)


def test_local_grammar_rows_stay_on_the_bitmask_device():
    bitmask = torch.empty((3, 2), dtype=torch.int32, device=META)
    grammar = GrammarOutput(structured_output_request_ids=["a", "c"], grammar_bitmask=bitmask)
    local = local_grammar_output(
        grammar, {"a": 0, "b": 1, "c": 2}, np.array([True, False, True]), np.array([0, 1, 2, 4])
    )
    assert local.structured_output_request_ids == ["a", "c"]
    assert local.grammar_bitmask.device == META and local.grammar_bitmask.shape == (3, 2)


def test_workspace_is_carved_on_the_given_device():
    regions = carve(plan_layout(4, 2, 2), META)
    assert {t.device for t in regions.values()} == {META}


def test_a_cuda_device_without_index_is_given_the_current_one(monkeypatch):
    """Launches name their device: "cuda" becomes "cuda:<current>"; other devices stay as they are."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert sharder_module._indexed(torch.device("cuda")) == torch.device("cuda", 3)
    assert sharder_module._indexed(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert sharder_module._indexed(META) == META


# -- launch configuration and caches ----------------------------------------------------------


@pytest.mark.parametrize("cap", [1, 5, 64, 10**6])
@pytest.mark.parametrize("per_request", [0, 1, 3, 100, 5000, 2**16, 2**20])
def test_block_is_the_largest_power_of_two_whose_tile_fits(per_request, cap):
    """Requests per program: a power of two, at most the capacity's, its tile within _TILE_ELEMENTS (at least 1)."""
    tile = sharder_module._TILE_ELEMENTS
    block = sharder_module._block(per_request, cap)
    per = max(1, per_request)
    assert block & (block - 1) == 0 and 1 <= block <= next_power_of_2(cap)
    assert block == 1 or block * per <= tile
    assert block == next_power_of_2(cap) or 2 * block * per > tile


TP, RANK = 2, 1


def _local_output(local_batch, ids_rows=None, sentinel=777):
    """A local output with 3 logprob columns; logprob ids of ``ids_rows`` rows, views of a larger tensor
    whose further rows hold ``sentinel``."""
    n, rows = local_batch.num_reqs, local_batch.num_logits
    ints = dict(dtype=torch.int64, device=DEVICE)
    ids_rows = rows if ids_rows is None else ids_rows
    ids = torch.full((rows + 2, 3), sentinel, **ints)
    ids[:ids_rows] = torch.arange(ids_rows * 3, **ints).view(ids_rows, 3)
    return SamplerOutput(
        sampled_token_ids=torch.arange(n * 2, **ints).view(n, 2),
        logprobs_tensors=LogprobsTensors(
            ids[:ids_rows], torch.zeros(rows, 3, device=DEVICE), torch.arange(rows, **ints)
        ),
        num_nans=torch.ones(rows, dtype=torch.int32, device=DEVICE),
        num_sampled=torch.ones(n, dtype=torch.int32, device=DEVICE),
        num_rejected=torch.zeros(n, dtype=torch.int32, device=DEVICE),
    )


def _step(sharder, batch, make_output=_local_output):
    shard = sharder.shard_sampler_inputs(batch, None)
    full = sharder.all_to_all_logits(torch.ones(batch.num_logits, 4, device=DEVICE), shard.metadata)
    gathered = sharder.gather_sampler_output(
        make_output(shard.local_batch),
        shard.metadata,
        batch,
        shard.local_batch,
        gather_num_nans=True,
        logprobs_dims=(2, 0),
    )
    return shard, full, gathered


def test_a_repeated_step_shape_computes_no_view_or_configuration_again(monkeypatch):
    batch = build_input_batch([4, 1, 6, 3, 0], [1, 3, 2, 1, 2], device=DEVICE)
    sharder = ProductionSharder(8, 4, comm=LoopbackComm(RANK, TP), device=DEVICE)
    _step(sharder, batch)
    # The first step grew the logprob buffers, which drops every cached view: the second fills the cache again.
    first = _step(sharder, batch)[2]
    remembered = []
    original = sharder._remember
    monkeypatch.setattr(sharder, "_remember", lambda key, value: remembered.append(key) or original(key, value))
    second = _step(sharder, batch)[2]
    assert remembered == []
    assert_same(first, second, "repeated step")


def test_logprob_ids_shorter_than_their_values_are_not_read_past_their_end():
    """With the checks off the pack reads no logits row past the shortest logprob tensor."""
    batch = build_input_batch([4, 1, 6, 3, 0], [1, 3, 2, 1, 2], device=DEVICE)
    sharder = ProductionSharder(8, 4, comm=LoopbackComm(RANK, TP), device=DEVICE, check_preconditions=False)
    _, _, gathered = _step(sharder, batch, lambda local: _local_output(local, ids_rows=local.num_logits - 1))
    ids = gathered.logprobs_tensors.logprob_token_ids
    assert not (ids == 777).any(), ids


def test_empty_batch_with_the_checks_off_equals_the_reference():
    """No request: the width is 1 (no reduction over no counts), as with the checks on."""
    batch = build_input_batch([], [], device=DEVICE)
    for check in (False, True):
        got = ProductionSharder(8, 4, comm=LoopbackComm(RANK, TP), device=DEVICE, check_preconditions=check)
        expected = ReferenceSharder(8, 4, comm=LoopbackComm(RANK, TP), device=DEVICE).shard_sampler_inputs(batch, None)
        assert_same(expected, got.shard_sampler_inputs(batch, None), f"empty batch, checks {check}")


def test_gathered_logprobs_are_float32_whatever_the_default_dtype():
    batch = build_input_batch([4, 1, 6, 3, 0], [1, 3, 2, 1, 2], device=DEVICE)
    sharder = ProductionSharder(8, 4, comm=LoopbackComm(RANK, TP), device=DEVICE)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _, _, gathered = _step(sharder, replace(batch))
    finally:
        torch.set_default_dtype(default)
    assert gathered.logprobs_tensors.logprobs.dtype == torch.float32


def test_a_launcher_without_a_c_launch_function_keeps_run(monkeypatch):
    import triton

    name = "shardspec_test_fake_driver_no_launch"
    monkeypatch.delitem(__import__("sys").modules, name, raising=False)
    monkeypatch.delenv("SHARDSPEC_BARE_LAUNCH", raising=False)
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    run = _fake_run(name, launch._BARE_FORMAT)
    del run.launch
    assert launch._bare_launch(run) is None


def test_without_direct_launches_a_launcher_always_goes_through_triton(monkeypatch):
    """Interpreted, or SHARDSPEC_DIRECT_LAUNCH=0: Triton's knobs are never read, nothing compiled is kept."""
    monkeypatch.setattr(launch, "_DIRECT", False)
    kernel = FakeKernel(_compiled(Recorder()))
    launcher = launch.Launcher(kernel)
    assert launcher._knobs is None
    launcher(1, ("k",), ("t",), {"BLOCK": 1})
    launcher(1, ("k",), ("t",), {"BLOCK": 1})
    assert launcher._direct == {} and len(kernel.calls) == 2


def test_requests_past_a_short_local_prefix_sum_are_not_read():
    """Checks off, a local cu_num_logits one request short (a view, the next entry a wild value): the pack
    sends that request as padding (zeros), as for any request past the local ones, and reads nothing of it."""
    batch = build_input_batch([4, 1, 6, 3, 0], [1, 3, 2, 1, 2], device=DEVICE)
    sharder = ProductionSharder(8, 4, comm=LoopbackComm(0, TP), device=DEVICE, check_preconditions=False)
    shard = sharder.shard_sampler_inputs(batch, None)
    local = shard.local_batch  # rank 0 owns requests 0, 2 and 4 (slots 4, 6, 0)
    cu = torch.tensor([*local.cu_num_logits[:-1].tolist(), 10**6], dtype=torch.int32, device=DEVICE)[:-1]
    output = _local_output(local)
    output = replace(output, sampled_token_ids=output.sampled_token_ids + 100)
    gathered = sharder.gather_sampler_output(
        output, shard.metadata, batch, replace(local, cu_num_logits=cu), gather_num_nans=True
    )
    # Width 3 (request 1 has 3 rows); the local ids are 2 wide, so the last column is zero-filled.
    assert gathered.sampled_token_ids[[0, 2]].tolist() == [[100, 101, 0], [102, 103, 0]]
    assert gathered.sampled_token_ids[4].tolist() == [0, 0, 0]
    assert gathered.num_sampled[[0, 2, 4]].tolist() == [1, 1, 0]
    assert gathered.num_nans[[0, 2, 4]].tolist() == [1, 2, 0]


class WordSizes:
    """Stands in for _WIDE_DTYPES: the word sizes the reorder tried, in order."""

    def __init__(self, entries):
        self.entries, self.tried = entries, []

    def __iter__(self):
        for size, dtype in self.entries:
            self.tried.append(size)
            yield size, dtype


@pytest.mark.parametrize("rows, widened", [(4, True), (3, False)])
def test_the_reorder_copies_words_from_a_buffer_size_on(monkeypatch, rows, widened):
    """The word copy is chosen by the size of the whole receive buffer (here 256-byte rows, from 1024 bytes on)."""
    words = WordSizes(((16, torch.complex128), (8, torch.int64), (4, torch.int32)))
    monkeypatch.setattr(exchange_module, "_WIDEN_FROM_BYTES", 1024)
    monkeypatch.setattr(exchange_module, "_WIDE_DTYPES", words)
    received = torch.arange(rows * 64, dtype=torch.float32).view(rows, 64)
    local = exchange_module._reorder(received, rows, 1, 64)  # one rank: the rows as they came
    assert words.tried == ([16] if widened else [])
    assert torch.equal(local, received)


def test_runtime_knobs_none_where_triton_has_no_runtime_knobs(monkeypatch):
    from triton import knobs

    monkeypatch.delattr(knobs, "runtime", raising=False)
    assert launch._runtime_knobs() is None


def test_a_launcher_reads_the_knobs_where_it_launches_directly(monkeypatch):
    from triton import knobs

    hooks = SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    monkeypatch.setattr(knobs, "runtime", hooks)
    monkeypatch.setattr(launch, "_DIRECT", True)
    assert launch.Launcher(FakeKernel(None))._knobs is hooks


@pytest.mark.parametrize("hook", ["launch_enter_hook", "launch_exit_hook"])
def test_either_launch_hook_sends_launches_through_triton(stream, monkeypatch, hook):
    import triton

    monkeypatch.setattr(triton, "__version__", "3.9.0")
    run = Recorder()
    kernel = FakeKernel(_compiled(run))
    launcher = launch.Launcher(kernel)
    launcher._knobs = SimpleNamespace(launch_enter_hook=Chain(), launch_exit_hook=Chain())
    launcher(1, ("k",), ("t",), {"BLOCK": 1})  # keeps the direct launch
    setattr(launcher._knobs, hook, Chain(print))
    launcher(1, ("k",), ("t",), {"BLOCK": 1})
    assert run.calls == [] and len(kernel.calls) == 2


def _unchecked_gather(make_output):
    """Rank 0 of 2 (local requests 0, 2 and 4 of the batch) with the checks off."""
    batch = build_input_batch([4, 1, 6, 3, 0], [1, 3, 2, 1, 2], device=DEVICE)
    sharder = ProductionSharder(8, 4, comm=LoopbackComm(0, TP), device=DEVICE, check_preconditions=False)
    shard = sharder.shard_sampler_inputs(batch, None)
    output = make_output(_local_output(shard.local_batch))
    return sharder.gather_sampler_output(output, shard.metadata, batch, shard.local_batch, gather_num_nans=True)


def _short(tensor, sentinel):
    """The tensor less its last row, as a view of one whose last row holds ``sentinel``."""
    longer = tensor.clone()
    longer[-1] = sentinel
    return longer[:-1]


def test_valid_outputs_with_the_checks_off_are_gathered_whole():
    gathered = _unchecked_gather(lambda out: out)
    assert gathered.sampled_token_ids[[0, 2, 4]].tolist() == [[0, 1, 0], [2, 3, 0], [4, 5, 0]]
    assert gathered.num_sampled[[0, 2, 4]].tolist() == [1, 1, 1]


@pytest.mark.parametrize("field", ["sampled_token_ids", "num_sampled", "num_rejected"])
def test_a_short_per_request_output_is_not_read_past_its_end(field):
    """Checks off, one per-request tensor a request short: that request is sent as padding, nothing read of it."""
    gathered = _unchecked_gather(lambda out: replace(out, **{field: _short(getattr(out, field), 999)}))
    for name in ("sampled_token_ids", "num_sampled", "num_rejected"):
        assert not (getattr(gathered, name) == 999).any(), name
    assert gathered.sampled_token_ids[4].tolist() == [0, 0, 0] and gathered.num_sampled[4] == 0
    assert gathered.sampled_token_ids[[0, 2]].tolist() == [[0, 1, 0], [2, 3, 0]]


@pytest.mark.parametrize("field", ["logprob_token_ids", "logprobs", "selected_token_ranks"])
def test_a_short_logprob_tensor_is_not_read_past_its_end(field):
    """Checks off, one of the three logprob tensors a row short: no value past its end reaches the gather."""
    batch = build_input_batch([4, 1, 6, 3, 0], [1, 3, 2, 1, 2], device=DEVICE)
    sharder = ProductionSharder(8, 4, comm=LoopbackComm(RANK, TP), device=DEVICE, check_preconditions=False)

    def short(local_batch):
        out = _local_output(local_batch)
        lp = out.logprobs_tensors
        return replace(out, logprobs_tensors=lp._replace(**{field: _short(getattr(lp, field), 999)}))

    lp = _step(sharder, batch, short)[2].logprobs_tensors
    for name in ("logprob_token_ids", "logprobs", "selected_token_ranks"):
        assert not (getattr(lp, name) == 999).any(), name


def test_the_sharder_is_on_the_cpu_by_default():
    sharder = ProductionSharder(4, 2, comm=LoopbackComm(0, 2))
    assert sharder.device == torch.device("cpu") and sharder._ws["local_idx_mapping"].device.type == "cpu"


def test_carved_regions_have_the_layout_dtypes_and_sizes():
    layout = plan_layout(5, 3, 2)
    regions = carve(layout, torch.device("cpu"))
    assert [(name, t.dtype, t.numel()) for name, t in regions.items()] == layout
    assert all(t.data_ptr() % 16 == 0 for t in regions.values())


@pytest.mark.parametrize(
    ("profile", "tp", "table"),
    [
        (VLLM_SEED, 1, {}),  # a group of one: the seed builds its sharder (vllm-0.33 and later refuse it)
        # vLLM 0.33's local dtypes (the batch's) at tp 2: an owner table gives rank 0 every request.
        (VLLM_034_SHARDED_CACHE, 2, {"owner_table": np.zeros(4, dtype=np.int32)}),
    ],
)
def test_a_full_batch_on_one_rank_equals_the_reference(profile, tp, table):
    """Rank 0 owns a batch at capacity (4 requests, up to 3 rows each): every region of the plan is used to its
    end."""
    batch = build_input_batch([2, 0, 3, 1], [3, 1, 3, 2], device=DEVICE)
    rank0 = {"comm": LoopbackComm(0, tp), "device": DEVICE, "rules": rules_of(profile)}
    expected = ReferenceSharder(4, 3, **rank0).shard_sampler_inputs(batch, None, **table)
    got = ProductionSharder(4, 3, **rank0).shard_sampler_inputs(batch, None, **table)
    assert expected.local_batch.num_reqs == 4 and expected.local_batch.num_logits == 9
    assert_same(expected, got, "full batch")


def test_next_power_of_2_is_the_smallest_power_of_two_not_below():
    assert [next_power_of_2(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 1000, 1024, 1025)] == [
        1,
        1,
        2,
        4,
        4,
        8,
        8,
        16,
        1024,
        1024,
        2048,
    ]
