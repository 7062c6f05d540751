"""The full text of every precondition error production raises: ID, message, field, request and rank.

test_impl_preconditions.py checks the ID, field and request of one violation per precondition; here
every message is compared whole, since it is what an engine's log shows, and more violations are
added: the draft totals, the device copies' dtype, shape and values, the logprobs' shapes, the
checks kept with the others off, and the extension declarations and fields. Several are raised on
rank 1, so that a rank dropped from the error shows.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch
from bundled import VLLM_033, VLLM_034, VLLM_034_SHARDED_CACHE, VLLM_SEED
from impl_steps import DEVICE
from test_impl_preconditions import (
    COUNTS,
    SCORE,
    SLOTS,
    VIOLATIONS,
    _all_to_all,
    _batch,
    _build,
    _gather,
    _output,
    _shard,
)

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.spec.errors import PreconditionError
from shardspec.spec.model import PROFILES, ExtensionSpec, GrammarOutput, LogprobsTensors

# The violations of test_impl_preconditions.py, by name: the whole text of their errors.
MESSAGES = {
    "batch-size": "[PRE-BATCH-SIZE] num_reqs=4 but 5 req_ids and idx_mapping_np of shape (5,) (field num_reqs, rank 0)",
    "capacity-logits": "[PRE-CAPACITY-LOGITS] request has 3 logits rows, more than the sharder's capacity "
    "max_num_logits_per_req=2 (field cu_num_logits, request 1, rank 0)",
    "capacity-reqs": "[PRE-CAPACITY-REQS] 5 requests exceed the sharder's capacity max_num_reqs=4 (field num_reqs, "
    "rank 0)",
    "cu-shape": "[PRE-CU-LOGITS] shape (3,), expected (6,) (field cu_num_logits_np, rank 0)",
    "cu-start": "[PRE-CU-LOGITS] starts at 1, not 0 (field cu_num_logits_np, rank 0)",
    "device-slots-shape": "[PRE-HOST-DEVICE-MATCH] device copy has shape (4,), the host copy (5,) (field idx_mapping, "
    "rank 0)",
    "drafts": "[PRE-DRAFTS] a request's logits rows must be 1 + its draft tokens (field num_draft_tokens_per_req, "
    "request 3, rank 0)",
    "drafts-none": "[PRE-DRAFTS] is None, so every request must have exactly 1 logits row (field "
    "num_draft_tokens_per_req, request 1, rank 0)",
    "dtype-device-slots": "[PRE-DTYPES] dtype torch.float32 is not int32/int64 (field idx_mapping, rank 0)",
    "dtype-host-slots": "[PRE-DTYPES] dtype float64 is not an integer type (field idx_mapping_np, rank 0)",
    "extension-kind": "[PRE-EXTENSION-SUPPORTED] x: kind 'token' is not one of ('request', 'logits_row') (field "
    "extension_fields, rank 0)",
    "extension-missing": "[PRE-EXTENSION-FIELDS] is declared but missing, and this rank owns 3 requests (field "
    "extensions.score, rank 0)",
    "extension-rows": "[PRE-EXTENSION-FIELDS] is torch.float32 (3,); declared torch.float32 (5,) (field "
    "extensions.score, rank 0)",
    "extension-undeclared": "[PRE-EXTENSION-FIELDS] is not declared in extension_fields, so the gather would drop it "
    "(field extensions.extra, rank 0)",
    "field-shapes": "[PRE-FIELD-SHAPES] shape (4,), expected (5,) (field seq_lens, rank 0)",
    "grammar-bitmask-rows": "[PRE-GRAMMAR-BITMASK] shape (2, 4); expected 3 rows (one per logits row of the listed "
    "requests) (field grammar_bitmask, rank 0)",
    "grammar-bitmask-blocks": "[PRE-GRAMMAR-BITMASK] S = 1 rows per block, but request 'req-6' has 2 logits rows "
    "(field grammar_bitmask, request 2, rank 0)",
    "grammar-repeated-id": "[PRE-GRAMMAR-IDS] entry 1 repeats a request id (field structured_output_request_ids, "
    "request 2, rank 0)",
    "grammar-unknown-id": "[PRE-GRAMMAR-IDS] entry 0 ('req-99') is not in the batch (field "
    "structured_output_request_ids, rank 0)",
    "local-output-nans": "[PRE-LOCAL-OUTPUT] is None; expected shape (5,) (field num_nans, rank 0)",
    "local-output-none": "[PRE-LOCAL-OUTPUT] is None but this rank owns 3 requests (field local_output, rank 0)",
    "local-output-rows": "[PRE-LOCAL-OUTPUT] shape (4, 2); expected (3, width) (field sampled_token_ids, rank 0)",
    "logits-shard-dtype": "[PRE-LOGITS-SHARD] is torch.int32, not a floating point tensor (field logits_shard, rank 0)",
    "logits-shard-rows": "[PRE-LOGITS-SHARD] shape (8, 8); expected (9, Vs) with Vs >= 1 (field logits_shard, rank 0)",
    "logprobs-dims": "[PRE-LOGPROBS-DIMS] (2, -1) is not a pair of non-negative ints (field logprobs_dims, rank 0)",
    "logprobs-dims-idle-rank": "[PRE-LOGPROBS-DIMS] (2,) is not a pair of non-negative ints (field logprobs_dims, "
    "rank 1)",
    "query-start-loc-shape": "[PRE-QUERY-START-LOC] shape (3,) is not (6,) (field query_start_loc, rank 0)",
    "req-ids-unique-with-grammar": "[PRE-REQ-IDS-UNIQUE] request ids are not unique (field req_ids, request 3, rank 0)",
    "slot-range-high": "[PRE-SLOT-RANGE] slot 8 is outside [0, 8) (field idx_mapping, request 2, rank 0)",
    "slot-range-negative": "[PRE-SLOT-RANGE] slot -1 is outside [0, 8) (field idx_mapping, request 1, rank 0)",
    "slot-unique": "[PRE-SLOT-UNIQUE] two requests share a slot (field idx_mapping, request 2, rank 0)",
    "zero-logits": "[PRE-LOGITS-PER-REQ] request has 0 logits rows; at least 1 is required (field cu_num_logits, "
    "request 1, rank 0)",
}


@pytest.mark.parametrize("name", sorted(VIOLATIONS))
def test_violation_message_in_full(name):
    violate = VIOLATIONS[name][0]
    with pytest.raises(PreconditionError) as caught:
        violate()
    assert str(caught.value) == MESSAGES[name]


def _ints(values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def _compared(batch):
    """Sharded on rank 1 with the device copies compared with the host copies (on a GPU too)."""
    sharder = ProductionSharder(8, 4, comm=LoopbackComm(1, 2), device=DEVICE, check_device_copies=True)
    return sharder.shard_sampler_inputs(batch, None)


def _drafts_sum_off():
    """Per-request drafts that match the counts, a total that does not."""
    return _shard(_batch(num_draft_tokens=7), rank=1)


def _logprobs(make):
    """The local output with logprobs_tensors replaced by ``make(rows)``, gathered with logprob dims."""

    def output(local_batch):
        return replace(_output(local_batch), logprobs_tensors=make(local_batch.num_logits))

    return lambda: _gather(output, logprobs_dims=(2, 1), rank=1)


def _lp(ids_shape, vals_shape, ranks_rows):
    return LogprobsTensors(
        torch.zeros(ids_shape, dtype=torch.int64, device=DEVICE),
        torch.zeros(vals_shape, device=DEVICE),
        torch.zeros(ranks_rows, dtype=torch.int64, device=DEVICE),
    )


def _extension(declared, value_of):
    """A gather on rank 1 declaring ``declared`` and carrying {"score": value_of(local_batch)}."""

    def output(local_batch):
        return replace(_output(local_batch), extensions={"score": value_of(local_batch)})

    return lambda: _gather(output, extension_fields=declared, rank=1)


def _declared(**spec):
    return lambda: _gather(_output, extension_fields=spec, rank=1)


# name -> (call that violates a precondition, the whole text of its error)
MORE = {
    "drafts-sum": (
        _drafts_sum_off,
        "[PRE-DRAFTS] is 7, but num_draft_tokens_per_req sums to 4 (field num_draft_tokens, rank 1)",
    ),
    "drafts-none-with-count": (
        lambda: _shard(replace(_build(SLOTS, [1] * 5), num_draft_tokens_per_req=None, num_draft_tokens=2), rank=1),
        "[PRE-DRAFTS] is 2 without num_draft_tokens_per_req (field num_draft_tokens, rank 1)",
    ),
    "drafts-shape": (
        lambda: _shard(_batch(num_draft_tokens_per_req=np.array([0, 2, 1, 0], np.int32)), rank=1),
        "[PRE-DRAFTS] shape (4,), expected (5,) (field num_draft_tokens_per_req, rank 1)",
    ),
    "dtype-drafts": (
        lambda: _shard(_batch(num_draft_tokens_per_req=np.array([0, 2, 1, 0, 1], np.float64)), rank=1),
        "[PRE-DTYPES] dtype float64 is not an integer type (field num_draft_tokens_per_req, rank 1)",
    ),
    "dtype-device-cu": (
        lambda: _shard(
            _batch(cu_num_logits=torch.tensor(np.cumsum([0, *COUNTS]), dtype=torch.float32, device=DEVICE)), rank=1
        ),
        "[PRE-DTYPES] dtype torch.float32 is not int32/int64 (field cu_num_logits, rank 1)",
    ),
    "device-cu-shape": (
        lambda: _shard(_batch(cu_num_logits=_ints([0, 1, 4], torch.int32)), rank=1),
        "[PRE-HOST-DEVICE-MATCH] device copy has shape (3,), the host copy (6,) (field cu_num_logits, rank 1)",
    ),
    "device-slots-values": (
        lambda: _compared(_batch(idx_mapping=_ints([4, 1, 7, 3, 0], torch.int32))),
        "[PRE-HOST-DEVICE-MATCH] device copy differs from idx_mapping_np at entry 2: 7 != 6 (field idx_mapping, "
        "request 2, rank 1)",
    ),
    "device-cu-values": (
        lambda: _compared(_batch(cu_num_logits=_ints([0, 1, 4, 5, 7, 9], torch.int32))),
        "[PRE-HOST-DEVICE-MATCH] device copy differs from cu_num_logits_np at entry 3: 5 != 6 (field cu_num_logits, "
        "rank 1)",
    ),
    "guard-device-slots-shape": (
        lambda: _shard(_batch(idx_mapping=_ints(SLOTS[:4])), rank=1, check_preconditions=False),
        "[PRE-HOST-DEVICE-MATCH] device copy has shape (4,), the host copy (5,) (field idx_mapping, rank 1)",
    ),
    "guard-device-cu-shape": (
        lambda: _shard(_batch(cu_num_logits=_ints([0, 1, 4])), rank=1, check_preconditions=False),
        "[PRE-HOST-DEVICE-MATCH] device copy has shape (3,), the host copy (6,) (field cu_num_logits, rank 1)",
    ),
    "guard-slot-range": (
        lambda: _shard(_batch(idx_mapping_np=np.array([4, 1, 9, 3, 0])), rank=1, check_preconditions=False),
        "[PRE-SLOT-RANGE] slot 9 is outside [0, 8) (field idx_mapping, request 2, rank 1)",
    ),
    "local-output-sampled": (
        lambda: _gather(lambda local: replace(_output(local), num_sampled=None), rank=1),
        "[PRE-LOCAL-OUTPUT] is None; expected shape (2,) (field num_sampled, rank 1)",
    ),
    "local-output-rejected": (
        lambda: _gather(lambda local: replace(_output(local), num_rejected=_ints([0, 0, 0], torch.int32)), rank=1),
        "[PRE-LOCAL-OUTPUT] is (3,); expected shape (2,) (field num_rejected, rank 1)",
    ),
    "logprob-ids-rows": (
        _logprobs(lambda rows: _lp((rows + 1, 3), (rows + 1, 3), rows)),
        "[PRE-LOCAL-OUTPUT] shape (5, 3); expected (4, columns) (field logprob_token_ids, rank 1)",
    ),
    "logprob-ids-dims": (
        _logprobs(lambda rows: _lp((rows, 3, 1), (rows, 3), rows)),
        "[PRE-LOCAL-OUTPUT] shape (4, 3, 1); expected (4, columns) (field logprob_token_ids, rank 1)",
    ),
    "logprob-values-rows": (
        _logprobs(lambda rows: _lp((rows, 3), (rows - 1, 3), rows)),
        "[PRE-LOCAL-OUTPUT] shape (3, 3); expected (4, columns) (field logprobs, rank 1)",
    ),
    "logprob-shapes-differ": (
        _logprobs(lambda rows: _lp((rows, 3), (rows, 2), rows)),
        "[PRE-LOCAL-OUTPUT] logprob_token_ids and logprobs differ in shape (field logprobs, rank 1)",
    ),
    "logprob-ranks": (
        _logprobs(lambda rows: _lp((rows, 3), (rows, 3), rows + 1)),
        "[PRE-LOCAL-OUTPUT] shape (5,) (field selected_token_ranks, rank 1)",
    ),
    "logits-shard-list": (
        lambda: _all_to_all(lambda rows: [[0.0] * 8] * rows),
        "[PRE-LOGITS-SHARD] is list, not a floating point tensor (field logits_shard, rank 0)",
    ),
    "logits-shard-no-columns": (
        lambda: _all_to_all(lambda rows: torch.zeros(rows, 0, device=DEVICE)),
        "[PRE-LOGITS-SHARD] shape (9, 0); expected (9, Vs) with Vs >= 1 (field logits_shard, rank 0)",
    ),
    "extension-name": (
        lambda: _gather(_output, extension_fields={1: SCORE["score"]}, rank=1),
        "[PRE-EXTENSION-SUPPORTED] entry 1 is not a str -> ExtensionSpec pair (field extension_fields, rank 1)",
    ),
    "extension-spec-type": (
        _declared(score=dict(per="request", dtype=torch.float32)),
        "[PRE-EXTENSION-SUPPORTED] entry 'score' is not a str -> ExtensionSpec pair (field extension_fields, rank 1)",
    ),
    "extension-dtype": (
        _declared(score=ExtensionSpec(per="request", dtype=torch.complex64)),
        "[PRE-EXTENSION-SUPPORTED] score: dtype torch.complex64 is not supported (field extension_fields, rank 1)",
    ),
    "extension-shape": (
        _declared(score=ExtensionSpec(per="request", dtype=torch.float32, shape=(2, -1))),
        "[PRE-EXTENSION-SUPPORTED] score: trailing shape (2, -1) is not a tuple of sizes (field extension_fields, "
        "rank 1)",
    ),
    "extension-shape-not-int": (
        _declared(score=ExtensionSpec(per="request", dtype=torch.float32, shape=(2.0,))),
        "[PRE-EXTENSION-SUPPORTED] score: trailing shape (2.0,) is not a tuple of sizes (field extension_fields, "
        "rank 1)",
    ),
    "extension-field-dtype": (
        _extension(
            {"score": ExtensionSpec(per="request", dtype=torch.float32, shape=(2,))},
            lambda local: torch.zeros(local.num_reqs, 2, dtype=torch.float64, device=DEVICE),
        ),
        "[PRE-EXTENSION-FIELDS] is torch.float64 (2, 2); declared torch.float32 (2, 2) (field extensions.score, "
        "rank 1)",
    ),
    "extension-field-not-a-tensor": (
        _extension({"score": ExtensionSpec(per="request", dtype=torch.float32)}, lambda local: [0.0] * local.num_reqs),
        "[PRE-EXTENSION-FIELDS] is list (); declared torch.float32 (2,) (field extensions.score, rank 1)",
    ),
    "extension-field-request-rows": (
        _extension(
            {"score": ExtensionSpec(per="request", dtype=torch.int32)},
            lambda local: torch.zeros(local.num_logits, dtype=torch.int32, device=DEVICE),
        ),
        "[PRE-EXTENSION-FIELDS] is torch.int32 (4,); declared torch.int32 (2,) (field extensions.score, rank 1)",
    ),
}


@pytest.mark.parametrize("name", sorted(MORE))
def test_more_violations_in_full(name):
    violate, message = MORE[name]
    with pytest.raises(PreconditionError) as caught:
        violate()
    assert str(caught.value) == message


def test_checks_kept_with_the_others_off_name_the_rank():
    batch = _batch(cu_num_logits_np=np.array([1, 1, 4, 6, 7, 9], np.int32))
    with pytest.raises(PreconditionError) as caught:
        _shard(batch, rank=1, check_preconditions=False)
    assert str(caught.value) == "[PRE-CU-LOGITS] starts at 1, not 0 (field cu_num_logits_np, rank 1)"


# The message for a bitmask of one row that lists no request, per profile.
NO_REQUEST_ONE_ROW = {
    VLLM_SEED: "[PRE-GRAMMAR-BITMASK] shape (1, 4); expected 0 rows (one per logits row of the listed requests) "
    "(field grammar_bitmask, rank 0)",
    VLLM_033: "[PRE-GRAMMAR-BITMASK] shape (1, 4): expected [G * S, B] (field grammar_bitmask, rank 0)",
    VLLM_034: "[PRE-GRAMMAR-BITMASK] shape (1, 4): expected [G * S, B] (field grammar_bitmask, rank 0)",
    VLLM_034_SHARDED_CACHE: "[PRE-GRAMMAR-BITMASK] shape (1, 4): expected [G * S, B] (field grammar_bitmask, rank 0)",
    "vllm-0.34-strict": "[PRE-GRAMMAR-BITMASK] shape (1, 4): expected [G * S, B] (field grammar_bitmask, rank 0)",
}


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("rows", [0, 1])
def test_a_grammar_output_listing_no_request_has_no_bitmask_rows(rows, profile):
    """No listed request, no bitmask row: accepted with 0 rows (no local grammar output), rejected with 1."""
    grammar = GrammarOutput(
        structured_output_request_ids=[], grammar_bitmask=torch.zeros((rows, 4), dtype=torch.int32, device=DEVICE)
    )
    if rows == 0:
        assert _shard(_batch(), grammar, profile=profile).local_grammar_output is None
        return
    with pytest.raises(PreconditionError) as caught:
        _shard(_batch(), grammar, profile=profile)
    assert str(caught.value) == NO_REQUEST_ONE_ROW[profile]


# The first offending request is named, also where requests before it sit at the edge of what is allowed.
FIRST_AT_THE_EDGE = {
    "zero-logits-after-one": (
        lambda: _shard(_build([4, 1, 6], [1, 2, 0])),
        "[PRE-LOGITS-PER-REQ] request has 0 logits rows; at least 1 is required (field cu_num_logits, request 2, "
        "rank 0)",
    ),
    "slot-range-after-slot-0": (
        lambda: _shard(_build([0, 4, 9], [1, 1, 1])),
        "[PRE-SLOT-RANGE] slot 9 is outside [0, 8) (field idx_mapping, request 2, rank 0)",
    ),
    "capacity-logits-after-a-full-request": (
        lambda: _shard(_build([4, 1, 6], [4, 5, 1]), max_num_logits_per_req=4),
        "[PRE-CAPACITY-LOGITS] request has 5 logits rows, more than the sharder's capacity max_num_logits_per_req=4 "
        "(field cu_num_logits, request 1, rank 0)",
    ),
    "cu-start-2": (
        lambda: _shard(_batch(cu_num_logits_np=np.array([2, 3, 6, 8, 9, 11], np.int32))),
        "[PRE-CU-LOGITS] starts at 2, not 0 (field cu_num_logits_np, rank 0)",
    ),
}


@pytest.mark.parametrize("name", sorted(FIRST_AT_THE_EDGE))
def test_first_offender_after_edge_values(name):
    violate, message = FIRST_AT_THE_EDGE[name]
    with pytest.raises(PreconditionError) as caught:
        violate()
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "field, precondition_id", [("seq_lens", "PRE-FIELD-SHAPES"), ("logits_indices", "PRE-FIELD-SHAPES")]
)
def test_short_fields_name_the_rank_with_the_checks_off(field, precondition_id):
    batch = _batch(**{field: getattr(_batch(), field)[:-1]})
    with pytest.raises(PreconditionError) as caught:
        _shard(batch, rank=1, check_preconditions=False)
    length = 5 if field == "seq_lens" else 9
    assert str(caught.value) == (
        f"[{precondition_id}] device copy has shape ({length - 1},), the host copy ({length},) (field {field}, rank 1)"
    )


def test_every_declared_field_is_checked_on_a_rank_that_owns_nothing():
    """A field may be missing where the rank owns no request; the fields declared after it are checked still."""
    declared = {
        "a": ExtensionSpec(per="request", dtype=torch.float32),
        "b": ExtensionSpec(per="logits_row", dtype=torch.int32),
    }

    def output(local_batch):
        assert local_batch.num_reqs == 0
        return replace(_output(local_batch), extensions={"b": torch.zeros(1, dtype=torch.int32, device=DEVICE)})

    with pytest.raises(PreconditionError) as caught:
        _gather(output, extension_fields=declared, rank=1, slots=[4], counts=[2])
    assert str(caught.value) == (
        "[PRE-EXTENSION-FIELDS] is torch.int32 (1,); declared torch.int32 (0,) (field extensions.b, rank 1)"
    )


def test_an_extension_field_may_have_an_empty_trailing_shape():
    """A trailing size of 0 is a size: declared, carried and gathered as [N, 0] and [L, 2, 0]."""
    declared = {
        "e": ExtensionSpec(per="request", dtype=torch.float32, shape=(0,)),
        "r": ExtensionSpec(per="logits_row", dtype=torch.int8, shape=(2, 0)),
    }

    def output(local):
        values = {
            "e": torch.zeros(local.num_reqs, 0, device=DEVICE),
            "r": torch.zeros(local.num_logits, 2, 0, dtype=torch.int8, device=DEVICE),
        }
        return replace(_output(local), extensions=values)

    gathered = _gather(output, extension_fields=declared, rank=1).extensions
    assert {name: tuple(value.shape) for name, value in gathered.items()} == {"e": (5, 0), "r": (9, 2, 0)}
