"""The preconditions vllm-0.33 adds or changes: production rejects each violation with the reference's
precondition ID, field and request, and accepts what the profile allows.

PRE-DRAFTS with admitted counts, PRE-HOST-DEVICE-MATCH against the admitted prefix sums,
PRE-SEQ-LENS-UPPER-BOUND and PRE-GRAMMAR-BITMASK's blocks (spec/SPEC.md section 7.1).
"""

from dataclasses import replace

import numpy as np
import pytest
import torch
from bundled import VLLM_033, VLLM_SEED
from impl_steps import DEVICE

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.reference import ReferenceSharder
from shardspec.spec.builders import build_grammar_output, build_input_batch
from shardspec.spec.errors import PreconditionError
from shardspec.spec.profiles import rules_of

SLOTS = [4, 1, 6, 3, 0]
SCHEDULED = [3, 2, 4, 1, 3]
ADMITTED = [1, 0, 2, 0, 2]


def _admitted(**overrides):
    batch = build_input_batch(SLOTS, SCHEDULED, admitted_drafts=ADMITTED, seq_lens_upper_bound=True, device=DEVICE)
    return replace(batch, **overrides)


def _plain(**overrides):
    return replace(build_input_batch(SLOTS, SCHEDULED, seq_lens_upper_bound=True, device=DEVICE), **overrides)


def _grammar(batch, positions=(2, 0, 3), rows=4, counts=None, **overrides):
    grammar = build_grammar_output(batch, list(positions), 100, block_rows=rows, num_acceptable_drafts=counts)
    return replace(grammar, **overrides)


def _admitted_array(values, dtype=np.int32):
    return np.array(values, dtype=dtype)


VIOLATIONS = {
    "admitted-without-drafts": lambda: (_admitted(num_draft_tokens_per_req=None), None),
    "admitted-float": lambda: (_admitted(num_admitted_draft_tokens=_admitted_array(ADMITTED, np.float32)), None),
    "admitted-short": lambda: (_admitted(num_admitted_draft_tokens=_admitted_array(ADMITTED[:-1])), None),
    "admitted-above-scheduled": lambda: (
        _admitted(num_admitted_draft_tokens=_admitted_array([1, 0, 2, 1, 2]), num_draft_tokens=6),
        None,
    ),
    "admitted-negative": lambda: (_admitted(num_admitted_draft_tokens=_admitted_array([1, -1, 2, 0, 2])), None),
    "admitted-total-scheduled": lambda: (_admitted(num_draft_tokens=int(np.sum(SCHEDULED)) - 5), None),
    # The device copy holds the scheduled prefix sums where it must hold the admitted ones.
    "admitted-device-cu-scheduled": lambda: (
        _admitted(cu_num_logits=torch.tensor(np.cumsum([0, *SCHEDULED]), dtype=torch.int32, device=DEVICE)),
        None,
    ),
    "admitted-fields-scheduled": lambda: (
        _plain(num_admitted_draft_tokens=_admitted_array(ADMITTED), num_draft_tokens=int(np.sum(ADMITTED))),
        None,
    ),
    # vLLM 0.33 always passes the bound (seq_lens_upper_bound: always).
    "seq-lens-bound-none": lambda: (_admitted(seq_lens_cpu_upper_bound=None), None),
    "seq-lens-bound-short": lambda: (_plain(seq_lens_cpu_upper_bound=torch.ones(4, dtype=torch.int32)), None),
    "seq-lens-bound-2d": lambda: (_plain(seq_lens_cpu_upper_bound=torch.ones(5, 1, dtype=torch.int32)), None),
    "seq-lens-bound-numpy": lambda: (_plain(seq_lens_cpu_upper_bound=np.ones(5, np.int32)), None),
    "seq-lens-bound-off-host": lambda: (
        _plain(seq_lens_cpu_upper_bound=torch.ones(5, dtype=torch.int32, device="meta")),
        None,
    ),
    "grammar-rows-not-blocks": lambda: (
        _plain(),
        _grammar(_plain(), grammar_bitmask=torch.zeros(11, 4, dtype=torch.int32, device=DEVICE)),
    ),
    # S = 3 rows per block, but request 2 is scheduled 4 rows.
    "grammar-block-too-short": lambda: (_plain(), _grammar(_plain(), rows=3)),
    # Admitted counts do not shrink the blocks: S is checked against the scheduled rows.
    "grammar-block-short-of-scheduled": lambda: (_admitted(), _grammar(_admitted(), rows=3)),
    "grammar-acceptable-long": lambda: (_plain(), _grammar(_plain(), counts=[0, 1, 2, 3])),
    "grammar-acceptable-short": lambda: (_plain(), _grammar(_plain(), counts=[0])),
    "grammar-bitmask-1d": lambda: (
        _plain(),
        _grammar(_plain(), grammar_bitmask=torch.zeros(12, dtype=torch.int32, device=DEVICE)),
    ),
    "grammar-no-ids-one-row": lambda: (
        _plain(),
        _grammar(_plain(), structured_output_request_ids=[], grammar_bitmask=torch.zeros(1, 4, dtype=torch.int32)),
    ),
}


def _shard(impl, inputs, rank=0, profile=VLLM_033, **options):
    batch, grammar = inputs
    if impl is ProductionSharder:
        options.setdefault("check_device_copies", True)  # as the reference does, also on a GPU
    sharder = impl(8, 4, comm=LoopbackComm(rank, 2), device=DEVICE, rules=rules_of(profile), **options)
    return sharder.shard_sampler_inputs(batch, grammar)


def _error(impl, inputs, **options) -> PreconditionError:
    with pytest.raises(PreconditionError) as caught:
        _shard(impl, inputs, **options)
    return caught.value


@pytest.mark.parametrize("name", sorted(VIOLATIONS))
@pytest.mark.parametrize("rank", [0, 1])
def test_violation_is_rejected_as_the_reference_rejects_it(name, rank):
    inputs = VIOLATIONS[name]()
    expected = _error(ReferenceSharder, inputs, rank=rank)
    got = _error(ProductionSharder, inputs, rank=rank)
    assert (got.precondition_id, got.field, got.request, got.rank) == (
        expected.precondition_id,
        expected.field,
        expected.request,
        expected.rank,
    ), f"production: {got}; reference: {expected}"


ALSO_WITH_CHECKS_OFF = ["admitted-above-scheduled", "admitted-negative", "admitted-short", "admitted-without-drafts"]


@pytest.mark.parametrize("name", ALSO_WITH_CHECKS_OFF)
def test_admitted_counts_the_kernels_rely_on_are_checked_with_the_checks_off(name):
    """The plan's row counts come from them: out of range, they could exceed the buffers."""
    assert _error(ProductionSharder, VIOLATIONS[name](), check_preconditions=False).precondition_id == "PRE-DRAFTS"


def test_drafts_of_another_shape_with_admitted_counts_are_pre_drafts():
    """The reference compares the two arrays by broadcasting first (see the report); production names
    the shape of num_draft_tokens_per_req, as PRE-DRAFTS does without admitted counts."""
    batch = _admitted(num_draft_tokens_per_req=np.array([2, 1, 3, 0], np.int32))
    error = _error(ProductionSharder, (batch, None))
    assert (error.precondition_id, error.field) == ("PRE-DRAFTS", "num_draft_tokens_per_req")


def test_vllm_seed_does_not_read_the_033_fields():
    """Under vllm-seed a bad seq_lens_cpu_upper_bound is an engine's own field, and a blocked bitmask
    is rows of its own layout (PRE-GRAMMAR-BITMASK counts one row per logits row)."""
    batch = _plain(seq_lens_cpu_upper_bound=torch.ones(4, dtype=torch.int32))
    _shard(ProductionSharder, (batch, None), profile=VLLM_SEED)
    grammar = _grammar(_plain(), rows=4)  # 12 rows; one per logits row would be 4 + 3 + 1 = 8
    expected = _error(ReferenceSharder, (_plain(), grammar), profile=VLLM_SEED)
    got = _error(ProductionSharder, (_plain(), grammar), profile=VLLM_SEED)
    assert (
        (got.precondition_id, got.field)
        == (expected.precondition_id, expected.field)
        == (
            "PRE-GRAMMAR-BITMASK",
            "grammar_bitmask",
        )
    )


VALID = {
    "admitted": lambda: _admitted(),
    "budget-0": lambda: build_input_batch(
        SLOTS, SCHEDULED, admitted_drafts=[0] * 5, seq_lens_upper_bound=True, device=DEVICE
    ),
    "bound-int64": lambda: _plain(seq_lens_cpu_upper_bound=torch.arange(5, dtype=torch.int64)),
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_033_inputs_are_accepted(name):
    batch = VALID[name]()
    for rank in (0, 1):
        inputs = (batch, _grammar(batch, counts=[1, 0, 2]))
        shard, reference = _shard(ProductionSharder, inputs, rank=rank), _shard(ReferenceSharder, inputs, rank=rank)
        assert shard.metadata.num_logits_per_rank == reference.metadata.num_logits_per_rank
        assert shard.local_grammar_output.num_acceptable_drafts == reference.local_grammar_output.num_acceptable_drafts
