"""The sharder's own choices that the goldens leave open: its refusal of an unknown profile, the local
batch's dtypes in vllm-seed (fixed int32 whatever the batch holds, CL-LOCAL-DTYPES) and the rows of a
per-row extension field when admitted draft counts trim the batch (CL-ADMITTED-DRAFTS).
"""

import pytest
import torch
from bundled import VLLM_033, VLLM_SEED

from shardspec.comm import LoopbackComm
from shardspec.fixtures.run import run_reference_case
from shardspec.reference import ReferenceSharder
from shardspec.spec.builders import build_input_batch
from shardspec.spec.case import Case, build_case_inputs
from shardspec.spec.case_edits import batch_extension_values, extension_fields
from shardspec.spec.model import admitted_cu_num_logits
from shardspec.spec.profiles import PROFILES, rules_of


def test_unknown_profile_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError) as caught:
        ReferenceSharder(4, 4, comm=LoopbackComm(0, 1), rules=rules_of("vllm-0.1"))
    assert str(caught.value) == f"unknown profile 'vllm-0.1' (bundled: {', '.join(PROFILES)})"


WIDE = {name: "int64" for name in ("seq_lens", "expanded_idx_mapping", "expanded_local_pos", "cu_num_logits")}


def _local_batch(profile, tp=1):
    batch = build_input_batch([3, 0, 2], [2, 1, 3], dtypes=WIDE)
    sharder = ReferenceSharder(4, 4, comm=LoopbackComm(0, tp), rules=rules_of(profile))
    return sharder.shard_sampler_inputs(batch, None).local_batch


def test_seed_local_batch_has_int32_device_fields_whatever_the_batch_holds():
    local = _local_batch(VLLM_SEED)
    for name in WIDE:
        assert getattr(local, name).dtype == torch.int32, name
    assert local.expanded_idx_mapping.tolist() == [3, 3, 0, 2, 2, 2]
    assert local.expanded_local_pos.tolist() == [0, 1, 0, 0, 1, 2]
    assert local.cu_num_logits.tolist() == [0, 2, 3, 6]


def test_vllm_033_local_batch_keeps_the_batch_dtypes():
    # tp 2 (vllm-0.33 builds no sharder of one rank: PRE-TP-SIZE): rank 0 owns slots 0 and 2.
    local = _local_batch(VLLM_033, tp=2)
    assert local.idx_mapping.tolist() == [0, 2] and local.cu_num_logits.tolist() == [0, 1, 4]
    for name in WIDE:
        assert getattr(local, name).dtype == torch.int64, name


PER_ROW = {"mask": {"per": "logits_row", "dtype": "int32", "shape": [2]}}


def test_per_row_extension_follows_the_admitted_rows():
    # Scheduled rows [3, 2, 3] with admitted drafts [0, 1, 2]: the engine samples 1 + 2 + 3 rows.
    case = Case(
        "admitted-extension",
        tp_size=2,
        slots=[0, 1, 2],
        num_logits_per_req=[3, 2, 3],
        admitted_drafts=[0, 1, 2],
        extensions=PER_ROW,
        rules=rules_of(VLLM_033),
    )
    batch = build_case_inputs(case).batch
    cu = admitted_cu_num_logits(batch)
    assert cu.tolist() == [0, 1, 3, 6]
    spec = extension_fields(PER_ROW)["mask"]
    expected = batch_extension_values("mask", spec, batch, "cpu", cu_num_logits=cu)
    assert expected.shape == (6, 2)
    traces = run_reference_case(case)
    assert len(traces) == 2
    for trace in traces:
        gathered = trace.gathered.extensions["mask"]
        assert torch.equal(gathered, expected), trace.rank
