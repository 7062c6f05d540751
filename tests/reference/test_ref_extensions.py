"""The reference gathers extension fields back in batch order on every rank (INV-GATHER-EXTENSIONS)."""

import pytest
import torch

from shardspec.fixtures.run import run_reference_case
from shardspec.spec.case import Case, build_case_inputs
from shardspec.spec.case_edits import batch_extension_values, extension_fields

DECLARED = {
    "mask": {"per": "logits_row", "dtype": "int32", "shape": [3]},
    "kept": {"per": "logits_row", "dtype": "float16", "shape": []},
    "asked": {"per": "request", "dtype": "bool", "shape": []},
    "knobs": {"per": "request", "dtype": "bfloat16", "shape": [2, 2]},
}
BATCHES = {
    "idle-rank-2": (3, [0, 3, 1, 4], [1, 2, 1, 3]),
    "all-on-rank-1": (2, [1, 3, 5], [2, 1, 1]),
    "empty": (4, [], []),
}


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_every_rank_returns_every_declared_field_in_batch_order(name):
    tp, slots, counts = BATCHES[name]
    case = Case(name, tp_size=tp, slots=slots, num_logits_per_req=counts, extensions=DECLARED)
    batch = build_case_inputs(case).batch
    for trace in run_reference_case(case):
        gathered = trace.gathered.extensions
        assert list(gathered) == list(DECLARED), f"rank {trace.rank}"
        for field, spec in extension_fields(DECLARED).items():
            expected = batch_extension_values(field, spec, batch, "cpu")
            rows = batch.num_reqs if spec.per == "request" else batch.num_logits
            assert expected.shape == (rows, *spec.shape)
            assert gathered[field].dtype == spec.dtype and torch.equal(gathered[field], expected), (trace.rank, field)


def test_extension_values_tell_requests_and_rows_apart():
    spec = extension_fields(DECLARED)["mask"]
    case = Case("distinct", tp_size=2, slots=[0, 1, 2], num_logits_per_req=[2, 1, 2])
    values = batch_extension_values("mask", spec, build_case_inputs(case).batch, "cpu")
    assert len({tuple(row.tolist()) for row in values}) == values.shape[0]


def test_without_declarations_the_result_has_no_extension_fields():
    case = Case("plain", tp_size=2, slots=[0, 1], num_logits_per_req=[1, 1])
    assert all(trace.gathered.extensions is None for trace in run_reference_case(case))
