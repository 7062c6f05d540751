"""The production sharder's host-side checks: one violation per precondition it checks.

Each violation starts from a valid batch and breaks one thing; the error names
the precondition ID, the field and, where there is one, the request at fault.
Capacity violations raise even with the checks switched off: nothing is truncated.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch
from bundled import VLLM_SEED
from impl_steps import DEVICE

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.spec.builders import build_grammar_output, build_input_batch
from shardspec.spec.errors import PreconditionError
from shardspec.spec.model import DEFAULT_PROFILE, ExtensionSpec, LogprobsTensors, SamplerOutput
from shardspec.spec.profiles import rules_of

TP = 2
SLOTS = [4, 1, 6, 3, 0]
COUNTS = [1, 3, 2, 1, 2]


def _build(slots, counts, **options):
    # With the bound where the default profile's engine always passes it (seq_lens_upper_bound: always).
    options.setdefault("seq_lens_upper_bound", rules_of(DEFAULT_PROFILE).has_upper_bound)
    return build_input_batch(slots, counts, device=DEVICE, **options)


def _batch(**overrides):
    return replace(_build(SLOTS, COUNTS), **overrides)


def _sharder(rank=0, max_num_reqs=8, max_num_logits_per_req=4, check_preconditions=True, profile=DEFAULT_PROFILE):
    return ProductionSharder(
        max_num_reqs,
        max_num_logits_per_req,
        comm=LoopbackComm(rank, TP),
        device=DEVICE,
        check_preconditions=check_preconditions,
        rules=rules_of(profile),
    )


def _shard(batch, grammar=None, **options):
    sharder = _sharder(**options)
    # Under the owner rule owner_table, the engine's initial table (slot mod tp).
    table = (
        {"owner_table": np.arange(sharder.max_num_reqs, dtype=np.int32) % TP} if sharder.rules.owner_by_table else {}
    )
    return sharder.shard_sampler_inputs(batch, grammar, **table)


def _output(local_batch, num_rows=None, logprob_cols=3):
    n, rows = local_batch.num_reqs, local_batch.num_logits
    n = n if num_rows is None else num_rows
    int64, int32 = dict(dtype=torch.int64, device=DEVICE), dict(dtype=torch.int32, device=DEVICE)
    return SamplerOutput(
        sampled_token_ids=torch.zeros(n, 2, **int64),
        logprobs_tensors=LogprobsTensors(
            torch.zeros(rows, logprob_cols, **int64),
            torch.zeros(rows, logprob_cols, device=DEVICE),
            torch.zeros(rows, **int64),
        ),
        num_nans=torch.zeros(rows, **int32),
        num_sampled=torch.ones(n, **int32),
        num_rejected=torch.zeros(n, **int32),
    )


def _gather(make_output, logprobs_dims=None, rank=0, slots=SLOTS, counts=COUNTS, extension_fields=None):
    batch = _build(slots, counts)
    sharder = _sharder(rank)
    shard = sharder.shard_sampler_inputs(batch, None)
    return sharder.gather_sampler_output(
        make_output(shard.local_batch),
        shard.metadata,
        batch,
        shard.local_batch,
        gather_num_nans=True,
        logprobs_dims=logprobs_dims,
        extension_fields=extension_fields,
    )


def _all_to_all(make_logits):
    batch = _build(SLOTS, COUNTS)
    sharder = _sharder()
    shard = sharder.shard_sampler_inputs(batch, None)
    return sharder.all_to_all_logits(make_logits(batch.num_logits), shard.metadata)


def _with_extension(name, value_of):
    """The local output carrying extension ``name`` (``value_of(local_batch)``; None: carries none)."""

    def make(local_batch):
        value = value_of(local_batch)
        return replace(_output(local_batch), extensions=None if value is None else {name: value})

    return make


SCORE = {"score": ExtensionSpec(per="logits_row", dtype=torch.float32)}


def _grammar(ids=None, row_delta=0, block_rows=None):
    """A grammar output for requests 2 and 0: one bitmask row per logits row (vllm-seed), or with
    ``block_rows`` blocks of that many rows (vllm-0.33)."""
    batch = _build(SLOTS, COUNTS)
    grammar = build_grammar_output(batch, [2, 0], 100, block_rows=block_rows)
    if ids is not None:
        grammar = replace(grammar, structured_output_request_ids=ids)
    bitmask = grammar.grammar_bitmask
    if row_delta:
        bitmask = bitmask[:-1] if row_delta < 0 else torch.cat([bitmask, bitmask[:1]])
    return batch, replace(grammar, grammar_bitmask=bitmask)


def _drafts_off_by_one():
    batch = _build(SLOTS, COUNTS)
    drafts = batch.num_draft_tokens_per_req.copy()
    drafts[3] += 1
    return replace(batch, num_draft_tokens_per_req=drafts, num_draft_tokens=int(drafts.sum()))


# name -> (call that violates a precondition, precondition ID, field, request or None)
VIOLATIONS = {
    "batch-size": (lambda: _shard(_batch(num_reqs=4)), "PRE-BATCH-SIZE", "num_reqs", None),
    "capacity-reqs": (lambda: _shard(_build(SLOTS, COUNTS), max_num_reqs=4), "PRE-CAPACITY-REQS", "num_reqs", None),
    "dtype-host-slots": (
        lambda: _shard(_batch(idx_mapping_np=np.array(SLOTS, np.float64))),
        "PRE-DTYPES",
        "idx_mapping_np",
        None,
    ),
    "dtype-device-slots": (
        lambda: _shard(_batch(idx_mapping=torch.tensor(SLOTS, dtype=torch.float32, device=DEVICE))),
        "PRE-DTYPES",
        "idx_mapping",
        None,
    ),
    "slot-range-high": (lambda: _shard(_build([4, 1, 8], [1, 1, 1])), "PRE-SLOT-RANGE", "idx_mapping", 2),
    "slot-range-negative": (lambda: _shard(_build([4, -1, 3], [1, 1, 1])), "PRE-SLOT-RANGE", "idx_mapping", 1),
    "slot-unique": (
        lambda: _shard(_build([4, 1, 4], [1, 1, 1], req_ids=["a", "b", "c"])),
        "PRE-SLOT-UNIQUE",
        "idx_mapping",
        2,
    ),
    "device-slots-shape": (
        lambda: _shard(_batch(idx_mapping=torch.tensor(SLOTS[:4], device=DEVICE))),
        "PRE-HOST-DEVICE-MATCH",
        "idx_mapping",
        None,
    ),
    "cu-start": (
        lambda: _shard(_batch(cu_num_logits_np=np.array([1, 1, 4, 6, 7, 9], np.int32))),
        "PRE-CU-LOGITS",
        "cu_num_logits_np",
        None,
    ),
    "cu-shape": (
        lambda: _shard(_batch(cu_num_logits_np=np.array([0, 1, 4], np.int32))),
        "PRE-CU-LOGITS",
        "cu_num_logits_np",
        None,
    ),
    "zero-logits": (lambda: _shard(_build([4, 1, 6], [2, 0, 1])), "PRE-LOGITS-PER-REQ", "cu_num_logits", 1),
    "capacity-logits": (
        lambda: _shard(_build(SLOTS, COUNTS), max_num_logits_per_req=2),
        "PRE-CAPACITY-LOGITS",
        "cu_num_logits",
        1,
    ),
    "query-start-loc-shape": (
        lambda: _shard(_batch(query_start_loc=torch.zeros(3, dtype=torch.int32, device=DEVICE))),
        "PRE-QUERY-START-LOC",
        "query_start_loc",
        None,
    ),
    "field-shapes": (
        lambda: _shard(_batch(seq_lens=torch.ones(4, dtype=torch.int32, device=DEVICE))),
        "PRE-FIELD-SHAPES",
        "seq_lens",
        None,
    ),
    "drafts": (lambda: _shard(_drafts_off_by_one()), "PRE-DRAFTS", "num_draft_tokens_per_req", 3),
    "drafts-none": (
        lambda: _shard(_batch(num_draft_tokens_per_req=None, num_draft_tokens=0)),
        "PRE-DRAFTS",
        "num_draft_tokens_per_req",
        1,
    ),
    "grammar-unknown-id": (
        lambda: _shard(*_grammar(ids=["req-99", "req-4"])),
        "PRE-GRAMMAR-IDS",
        "structured_output_request_ids",
        None,
    ),
    "grammar-repeated-id": (
        lambda: _shard(*_grammar(ids=["req-6", "req-6"])),
        "PRE-GRAMMAR-IDS",
        "structured_output_request_ids",
        2,
    ),
    "grammar-bitmask-rows": (
        lambda: _shard(*_grammar(row_delta=-1), profile=VLLM_SEED),
        "PRE-GRAMMAR-BITMASK",
        "grammar_bitmask",
        None,
    ),
    # Blocks of one row, but the request at batch position 2 (listed first) has 2 logits rows
    # (vllm-0.33, CL-GRAMMAR-BLOCKS).
    "grammar-bitmask-blocks": (
        lambda: _shard(*_grammar(block_rows=1)),
        "PRE-GRAMMAR-BITMASK",
        "grammar_bitmask",
        2,
    ),
    "req-ids-unique-with-grammar": (
        lambda: _shard(_batch(req_ids=["req-4", "b", "req-6", "b", "e"]), _grammar()[1]),
        "PRE-REQ-IDS-UNIQUE",
        "req_ids",
        3,
    ),
    "local-output-rows": (
        lambda: _gather(lambda local: _output(local, num_rows=local.num_reqs + 1)),
        "PRE-LOCAL-OUTPUT",
        "sampled_token_ids",
        None,
    ),
    "local-output-none": (lambda: _gather(lambda local: None), "PRE-LOCAL-OUTPUT", "local_output", None),
    "local-output-nans": (
        lambda: _gather(lambda local: replace(_output(local), num_nans=None)),
        "PRE-LOCAL-OUTPUT",
        "num_nans",
        None,
    ),
    "logprobs-dims": (lambda: _gather(_output, logprobs_dims=(2, -1)), "PRE-LOGPROBS-DIMS", "logprobs_dims", None),
    "logits-shard-rows": (
        lambda: _all_to_all(lambda rows: torch.zeros(rows - 1, 8, device=DEVICE)),
        "PRE-LOGITS-SHARD",
        "logits_shard",
        None,
    ),
    "logits-shard-dtype": (
        lambda: _all_to_all(lambda rows: torch.zeros(rows, 8, dtype=torch.int32, device=DEVICE)),
        "PRE-LOGITS-SHARD",
        "logits_shard",
        None,
    ),
    "extension-undeclared": (
        lambda: _gather(_with_extension("extra", lambda local: torch.zeros(local.num_reqs))),
        "PRE-EXTENSION-FIELDS",
        "extensions.extra",
        None,
    ),
    "extension-missing": (
        lambda: _gather(_with_extension("score", lambda local: None), extension_fields=SCORE),
        "PRE-EXTENSION-FIELDS",
        "extensions.score",
        None,
    ),
    "extension-rows": (
        lambda: _gather(_with_extension("score", lambda local: torch.zeros(local.num_reqs)), extension_fields=SCORE),
        "PRE-EXTENSION-FIELDS",
        "extensions.score",
        None,
    ),
    "extension-kind": (
        lambda: _gather(_output, extension_fields={"x": ExtensionSpec(per="token", dtype=torch.float32)}),
        "PRE-EXTENSION-SUPPORTED",
        "extension_fields",
        None,
    ),
    "logprobs-dims-idle-rank": (
        lambda: _gather(lambda local: None, logprobs_dims=(2,), rank=1, slots=[0, 2], counts=[1, 1]),
        "PRE-LOGPROBS-DIMS",
        "logprobs_dims",
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(VIOLATIONS))
def test_violation_is_rejected_with_its_id(name):
    violate, precondition_id, field, request = VIOLATIONS[name]
    with pytest.raises(PreconditionError) as caught:
        violate()
    error = caught.value
    assert error.precondition_id == precondition_id, str(error)
    assert error.field == field, str(error)
    assert f"[{precondition_id}]" in str(error) and error.rank is not None
    assert error.request == request, str(error)


@pytest.mark.parametrize(
    "capacity, precondition_id",
    [
        (dict(max_num_reqs=4), "PRE-CAPACITY-REQS"),
        (dict(max_num_logits_per_req=2), "PRE-CAPACITY-LOGITS"),
    ],
)
def test_capacity_is_enforced_with_checks_off(capacity, precondition_id):
    """Buffers are sized by the capacity: a larger batch is rejected, never truncated."""
    batch = _build(SLOTS, COUNTS)
    before = batch.idx_mapping.clone()
    with pytest.raises(PreconditionError) as caught:
        _shard(batch, check_preconditions=False, **capacity)
    assert caught.value.precondition_id == precondition_id
    assert torch.equal(batch.idx_mapping, before)
