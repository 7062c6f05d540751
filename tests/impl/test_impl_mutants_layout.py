"""The sharder's fixed structure piece by piece: the workspace's regions and their names, the regions
the plan kernel writes per local dtype (and whether the local fields need converting), the grammar
blocks cut with the checks off, unsigned host arrays, and the profile argument reaching the checks."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from bundled import VLLM_SEED
from impl_steps import DEVICE

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder, checks
from shardspec.impl import sharder as sharder_module
from shardspec.impl.grammar import _local_blocks
from shardspec.impl.local_batch import convert_views, local_regions
from shardspec.impl.workspace import LOCAL_FIELDS, local_region, logprobs_layout, plan_layout
from shardspec.spec.builders import build_input_batch
from shardspec.spec.errors import PreconditionError
from shardspec.spec.model import GrammarOutput
from shardspec.spec.profiles import PROFILES, ProfileError, rules_of

I32, I64 = torch.int32, torch.int64


def _expected_plan_layout(reqs: int, rows_per_req: int, tp: int) -> list:
    rows, sampled = reqs * rows_per_req, max(1, reqs) * (rows_per_req + 3)
    sizes = {
        "idx_mapping": reqs,
        "cu_num_logits": reqs + 1,
        "expanded_idx_mapping": rows,
        "expanded_local_pos": rows,
        "seq_lens": reqs,
    }
    return [
        ("sorted_logits_indices", I64, rows),
        ("gathered_src_indices", I64, reqs),
        ("local_logits_indices", I64, rows),
        *((f"local_{name}", I32, sizes[name]) for name in LOCAL_FIELDS),
        *((f"local_{name}_int64", I64, sizes[name]) for name in LOCAL_FIELDS),
        ("send_sampled", I64, sampled),
        ("recv_sampled", I64, tp * sampled),
    ]


# Capacity 1 and 0 tell max(1, reqs) from any other floor; 5 requests tell the per-request sizes apart.
@pytest.mark.parametrize("reqs", [0, 1, 5])
def test_plan_regions_are_exactly_the_capacity(reqs):
    """Sized once for the capacity: a region any larger is device memory no step uses."""
    assert plan_layout(reqs, 3, 2) == _expected_plan_layout(reqs, 3, 2)


@pytest.mark.parametrize("reqs", [0, 1, 5])
def test_logprob_regions_are_exactly_the_capacity(reqs):
    rows = max(1, reqs) * 3
    assert logprobs_layout(reqs, 3, 2, 4) == [
        ("send_ids", I64, rows * 5),
        ("send_vals", torch.float32, rows * 4),
        ("recv_ids", I64, 2 * rows * 5),
        ("recv_vals", torch.float32, 2 * rows * 4),
    ]


def test_int64_fields_get_the_int64_region_and_every_other_dtype_the_int32_one():
    assert local_region("seq_lens", I64) == "local_seq_lens_int64"
    assert [local_region("seq_lens", d) for d in (I32, torch.int16, torch.uint8)] == ["local_seq_lens"] * 3


def _sharder(**options) -> ProductionSharder:
    return ProductionSharder(8, 4, comm=LoopbackComm(1, 2), **options)


def test_an_unknown_profile_names_the_ones_implemented():
    """The sharder takes a profile's rules; the name is resolved where it is given, which names the bundled ones."""
    with pytest.raises(ProfileError) as caught:
        _sharder(rules=rules_of("vllm-0.1"))
    assert str(caught.value) == f"unknown profile 'vllm-0.1' (bundled: {', '.join(PROFILES)})"


@pytest.mark.parametrize(
    ("dtypes", "convert"),
    [((I32,) * 5, False), ((I64,) * 5, False), ((I32, I64, I64, I32, I64), False), ((torch.int16,) + (I32,) * 4, True)],
)
def test_the_plan_regions_of_local_dtypes_are_kept_and_say_whether_to_convert(dtypes, convert):
    """Kept per dtypes so that a step does not rebuild them; only a dtype without a region of its own
    needs its field converted after the launch."""
    sharder = _sharder()
    regions, outputs, addresses, converts = found = sharder._regions(dtypes)
    assert sharder._regions(dtypes) is found and sharder._regions(None) is sharder._seed_regions
    assert converts is convert
    for name, dtype in zip(LOCAL_FIELDS, dtypes, strict=True):
        assert regions[f"local_{name}"] is sharder._ws[local_region(name, dtype)]
    assert addresses == tuple(t.data_ptr() for t in outputs)


def test_blocks_of_a_bitmask_not_a_whole_number_of_blocks_are_cut_whole():
    """With the checks off (PRE-GRAMMAR-BITMASK unchecked), S is the rows per request rounded down:
    the second request's block is rows 2 and 3, never part of row 4."""
    grammar = GrammarOutput(
        structured_output_request_ids=["a", "b"],
        grammar_bitmask=torch.arange(5).reshape(5, 1),
        num_acceptable_drafts=None,
    )
    local = _local_blocks(grammar, np.array([1]))
    assert local.structured_output_request_ids == ["b"] and local.grammar_bitmask.flatten().tolist() == [2, 3]


def _batch(**overrides):
    return replace(build_input_batch([4, 1, 6, 3, 0], [3, 2, 4, 1, 3]), **overrides)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.uint64])
def test_unsigned_host_slots_and_draft_counts_are_integers(dtype):
    batch = _batch()
    batch = replace(
        batch,
        idx_mapping_np=batch.idx_mapping_np.astype(dtype),
        num_draft_tokens_per_req=batch.num_draft_tokens_per_req.astype(dtype),
    )
    cu, counts, width = checks.check_input_batch(batch, max_num_reqs=8, max_num_logits_per_req=4, rank=1)
    assert (cu.tolist(), counts.tolist(), width) == ([0, 3, 5, 9, 10, 13], [3, 2, 4, 1, 3], 4)


def test_an_unsigned_slot_past_the_capacity_is_out_of_range():
    with pytest.raises(PreconditionError) as caught:
        checks.check_slot_range(np.array([3, 0, 8], np.uint32), 8, 1)
    assert str(caught.value) == "[PRE-SLOT-RANGE] slot 8 is outside [0, 8) (field idx_mapping, request 2, rank 1)"


def test_vllm_seed_with_the_checks_off_does_not_read_admitted_counts():
    """The guards kept with the checks off follow the sharder's profile: vllm-seed has no admitted
    counts, so counts that vllm-0.33 would reject (and whose rows it would lay out) change nothing."""
    # The step launches Triton kernels: the batch and the sharder on the device they run on (a GPU where there is one).
    batch = build_input_batch([4, 1, 6, 3, 0], [3, 2, 4, 1, 3], device=DEVICE)
    ignored = replace(batch, num_admitted_draft_tokens=np.full(5, 9, np.int32))
    sharder = _sharder(rules=rules_of(VLLM_SEED), check_preconditions=False, device=DEVICE)
    plain = sharder.shard_sampler_inputs(batch, None).metadata
    got = sharder.shard_sampler_inputs(ignored, None).metadata
    assert got.num_logits_per_rank == plain.num_logits_per_rank == [10, 3]
    assert got.max_num_logits_per_req == plain.max_num_logits_per_req == 4


def test_the_cache_of_step_views_never_holds_more_than_its_bound():
    """An engine with ever new step shapes must not grow the cache without end: a full cache is
    emptied before the next entry goes in."""
    sharder = _sharder()
    bound = sharder_module._MAX_CACHED_VIEWS
    for key in range(bound):
        sharder._remember(("shape", key), key)
    assert len(sharder._views) == bound
    assert sharder._remember(("shape", bound), bound) == bound
    assert sharder._views == {("shape", bound): bound}


@pytest.mark.parametrize("count", [len(LOCAL_FIELDS) - 1, len(LOCAL_FIELDS) + 1])
def test_local_dtypes_of_the_wrong_length_are_refused_not_paired_off(count):
    # One dtype per local field, in LOCAL_FIELDS' order: a tuple one short (or long) would pair
    # every field after the gap with its neighbour's dtype, so it is an error, not a truncation.
    dtypes = (I32,) * count
    workspace = {local_region(name, I32): torch.zeros(2, dtype=I32) for name in LOCAL_FIELDS}
    views = {f"local_{name}": torch.zeros(2, dtype=I32) for name in LOCAL_FIELDS}
    with pytest.raises(ValueError, match="zip"):
        local_regions(workspace, dtypes)
    with pytest.raises(ValueError, match="zip"):
        convert_views(views, dtypes)
