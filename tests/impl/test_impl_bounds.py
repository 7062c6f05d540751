"""The production sharder never reads or writes outside what a step owns, whatever the device values.

Host copies decide the plan's sizes and are checked before any kernel runs;
device copies that disagree with them (PRE-HOST-DEVICE-MATCH, which the spec
leaves undefined where it is not checked) may make the results wrong but must
not make a kernel write outside the step's part of the workspace. The
workspace is filled with a canary byte first, so any stray write shows.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch
from impl_steps import DEVICE

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.spec.builders import build_input_batch
from shardspec.spec.errors import PreconditionError
from shardspec.spec.model import LogprobsTensors, SamplerOutput

TP, RANK = 2, 0
SLOTS = [2, 5, 0, 3, 6]
COUNTS = [1, 3, 2, 1, 2]
CANARY = 0xAB
ON_CPU = DEVICE.type == "cpu"


def _sharder(**options) -> ProductionSharder:
    return ProductionSharder(8, 4, comm=LoopbackComm(RANK, TP), device=DEVICE, **options)


def _workspace_bytes(sharder: ProductionSharder) -> torch.Tensor:
    """Every byte of the plan and sampled-wire workspace (one buffer)."""
    region = sharder._ws["sorted_logits_indices"]
    return torch.empty(0, dtype=torch.uint8, device=region.device).set_(region.untyped_storage())


def _fill_canary(sharder: ProductionSharder) -> None:
    _workspace_bytes(sharder).fill_(CANARY)
    sharder._ws["local_cu_num_logits"][:1].zero_()  # the one entry the sharder keeps from construction


def _assert_only_written(sharder: ProductionSharder, written: list[torch.Tensor]) -> None:
    """Bytes outside ``written`` (views of the workspace) still hold the canary."""
    workspace = _workspace_bytes(sharder)
    base = workspace.data_ptr()
    untouched = torch.ones(workspace.numel(), dtype=torch.bool, device=workspace.device)
    for view in written + [sharder._ws["local_cu_num_logits"][:1]]:
        start = view.data_ptr() - base
        untouched[start : start + view.numel() * view.element_size()] = False
    stray = torch.nonzero(untouched & (workspace != CANARY)).flatten()
    assert stray.numel() == 0, f"{stray.numel()} workspace bytes written outside the step, first at {stray[:8]}"


def _shard_views(shard) -> list[torch.Tensor]:
    local = shard.local_batch
    return [
        shard.sorted_logits_indices,
        shard.metadata.gathered_src_indices,
        local.idx_mapping,
        local.cu_num_logits,
        local.seq_lens,
        local.logits_indices,
        local.expanded_idx_mapping,
        local.expanded_local_pos,
    ]


def _local_output(local_batch) -> SamplerOutput:
    n, rows = local_batch.num_reqs, local_batch.num_logits
    ints = dict(dtype=torch.int64, device=DEVICE)
    return SamplerOutput(
        sampled_token_ids=torch.arange(n * 2, **ints).view(n, 2),
        logprobs_tensors=LogprobsTensors(
            torch.ones(rows, 3, **ints), torch.zeros(rows, 3, device=DEVICE), torch.zeros(rows, **ints)
        ),
        num_nans=torch.ones(rows, dtype=torch.int32, device=DEVICE),
        num_sampled=torch.ones(n, dtype=torch.int32, device=DEVICE),
        num_rejected=torch.zeros(n, dtype=torch.int32, device=DEVICE),
    )


def _device(values) -> torch.Tensor:
    return torch.tensor(np.array(values, dtype=np.int64), device=DEVICE)


CU = np.array([0, 1, 4, 6, 7, 9])
# Device copies that disagree with valid host copies, each in its own way.
DISAGREEING = {
    "cu-huge": dict(cu_num_logits=_device(CU * 100_000)),
    "cu-negative": dict(cu_num_logits=_device(-CU)),
    "cu-decreasing": dict(cu_num_logits=_device(CU[::-1])),
    "cu-int32-extremes": dict(
        cu_num_logits=torch.tensor([0, 2**31 - 1, -(2**31), 5, 2**31 - 1, 9], dtype=torch.int32, device=DEVICE)
    ),
    "slots-negative": dict(idx_mapping=_device([-3, -6, -1, -4, -7])),
    "slots-huge": dict(idx_mapping=_device([2**33 + s for s in SLOTS])),
    "slots-owned-elsewhere": dict(idx_mapping=_device([s + 1 for s in SLOTS])),
    "slots-all-mine": dict(idx_mapping=_device([0, 2, 4, 6, 8])),
}


@pytest.mark.parametrize(
    "checks",
    [dict(check_preconditions=False), dict(check_device_copies=False)],
    ids=["checks-off", "device-copies-unchecked"],
)
@pytest.mark.parametrize("name", sorted(DISAGREEING))
def test_disagreeing_device_copies_stay_in_bounds(name, checks):
    batch = replace(build_input_batch(SLOTS, COUNTS, device=DEVICE), **DISAGREEING[name])
    sharder = _sharder(**checks)
    _fill_canary(sharder)
    shard = sharder.shard_sampler_inputs(batch, None)
    _assert_only_written(sharder, _shard_views(shard))
    logits = torch.zeros(batch.num_logits, 16, device=DEVICE)
    full = sharder.all_to_all_logits(logits, shard.metadata)
    gathered = sharder.gather_sampler_output(
        _local_output(shard.local_batch),
        shard.metadata,
        batch,
        shard.local_batch,
        gather_num_nans=True,
        logprobs_dims=(2, 0),
    )
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()  # an illegal access would surface here
    _assert_only_written(sharder, _shard_views(shard) + [sharder._ws["send_sampled"], sharder._ws["recv_sampled"]])
    # Sizes follow the host copies, which are valid.
    assert full.shape == (shard.local_batch.num_logits, 32)
    assert gathered.sampled_token_ids.shape == (5, 3) and gathered.logprobs_tensors.logprobs.shape == (9, 3)


MISMATCHES = {
    "idx_mapping": (dict(idx_mapping=_device([2, 5, 1, 3, 6])), 2),
    "cu_num_logits": (dict(cu_num_logits=_device([0, 1, 4, 5, 7, 9])), None),
}


@pytest.mark.parametrize("compare", [None, True] if ON_CPU else [True], ids=lambda c: f"check_device_copies={c}")
@pytest.mark.parametrize("field", sorted(MISMATCHES))
def test_host_device_mismatch_is_rejected_before_any_kernel(field, compare):
    """Compared by default where the device copies are host memory, on a GPU when asked to."""
    change, request = MISMATCHES[field]
    batch = replace(build_input_batch(SLOTS, COUNTS, device=DEVICE), **change)
    sharder = _sharder(check_device_copies=compare)
    _fill_canary(sharder)
    with pytest.raises(PreconditionError) as caught:
        sharder.shard_sampler_inputs(batch, None)
    error = caught.value
    assert (error.precondition_id, error.field, error.request, error.rank) == (
        "PRE-HOST-DEVICE-MATCH",
        field,
        request,
        RANK,
    ), str(error)
    _assert_only_written(sharder, [])  # rejected before the plan kernel ran


def test_device_copies_compared_on_strided_views():
    """The comparison reads the device copy by its strides too: equal values in a view pass."""
    batch = build_input_batch(SLOTS, COUNTS, device=DEVICE)
    slots = torch.stack([batch.idx_mapping, -batch.idx_mapping], dim=-1).flatten()[::2]
    shard = _sharder(check_device_copies=True).shard_sampler_inputs(replace(batch, idx_mapping=slots), None)
    assert shard.local_batch.idx_mapping.tolist() == [2, 0, 6]


@pytest.mark.parametrize("check_preconditions", [True, False])
@pytest.mark.parametrize("slot", [2**33, 2**63 - 1, -(2**33)])
def test_slot_far_out_of_range_is_rejected_by_id(slot, check_preconditions):
    """Once a 64 GiB MemoryError: a histogram was sized by the largest slot."""
    slots = [4, 1, slot]
    batch = build_input_batch([4, 1, 0], [1, 1, 1], device=DEVICE)
    batch = replace(batch, idx_mapping_np=np.array(slots, dtype=np.int64), idx_mapping=_device(slots))
    sharder = _sharder(check_preconditions=check_preconditions)
    _fill_canary(sharder)
    with pytest.raises(PreconditionError) as caught:
        sharder.shard_sampler_inputs(batch, None)
    assert (caught.value.precondition_id, caught.value.request) == ("PRE-SLOT-RANGE", 2), str(caught.value)
    _assert_only_written(sharder, [])


@pytest.mark.parametrize("slots_dtype", [np.int32, np.uint32, np.int64, np.uint64])
def test_slot_range_in_every_integer_dtype(slots_dtype):
    batch = build_input_batch([4, 1, 0], [1, 1, 1], device=DEVICE)
    with pytest.raises(PreconditionError, match="PRE-SLOT-RANGE"):
        _sharder(check_preconditions=False).shard_sampler_inputs(
            replace(batch, idx_mapping_np=np.array([4, 8, 0], dtype=slots_dtype)), None
        )
    ok = replace(batch, idx_mapping_np=np.array([4, 1, 0], dtype=slots_dtype))
    assert _sharder().shard_sampler_inputs(ok, None).local_batch.idx_mapping_np.tolist() == [4, 0]


# What stays checked with the checks off: a kernel reads these device fields up to the host's counts.
SHORT_FIELDS = {
    "idx_mapping": "PRE-HOST-DEVICE-MATCH",
    "cu_num_logits": "PRE-HOST-DEVICE-MATCH",
    "seq_lens": "PRE-FIELD-SHAPES",
    "logits_indices": "PRE-FIELD-SHAPES",
}


@pytest.mark.parametrize("field", sorted(SHORT_FIELDS))
def test_short_device_field_is_rejected_with_checks_off(field):
    batch = build_input_batch(SLOTS, COUNTS, device=DEVICE)
    batch = replace(batch, **{field: getattr(batch, field)[:-1]})
    with pytest.raises(PreconditionError) as caught:
        _sharder(check_preconditions=False).shard_sampler_inputs(batch, None)
    assert (caught.value.precondition_id, caught.value.field) == (SHORT_FIELDS[field], field)


def test_float_draft_counts_are_rejected_as_dtypes():
    batch = build_input_batch(SLOTS, COUNTS, device=DEVICE)
    batch = replace(batch, num_draft_tokens_per_req=batch.num_draft_tokens_per_req.astype(np.float64))
    with pytest.raises(PreconditionError) as caught:
        _sharder().shard_sampler_inputs(batch, None)
    assert (caught.value.precondition_id, caught.value.field) == ("PRE-DTYPES", "num_draft_tokens_per_req")
