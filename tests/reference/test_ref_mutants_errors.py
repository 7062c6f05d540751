"""What a rejection names beyond its ID: the rank that found it, the field, and what was found.

test_ref_preconditions.py checks ID, field and request of one violation per precondition; these add
the rank (PreconditionError.rank and the message's "rank N"); the field, verdict and message of every
branch of the extension-field checks, where one rank may own nothing and several fields are declared;
every branch of the grammar, logits-shard, local-output, extension-declaration and draft checks, and the
input-batch checks that one violation per ID does not reach, with their messages.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch
from bundled import VLLM_SEED
from test_ref_preconditions import (
    COUNTS,
    MASK,
    SLOTS,
    VIOLATIONS,
    _batch,
    _drafts_off_by_one,
    _gather,
    _gather_extensions,
    _output,
    _shard,
)

from shardspec.comm import LoopbackComm
from shardspec.reference import ReferenceSharder
from shardspec.spec.builders import build_grammar_output, build_input_batch
from shardspec.spec.errors import PreconditionError
from shardspec.spec.model import ExtensionSpec, SamplerOutput


@pytest.mark.parametrize("precondition_id", sorted(VIOLATIONS))
def test_violation_names_the_rank_that_found_it(precondition_id):
    violate, _, _ = VIOLATIONS[precondition_id]
    with pytest.raises(PreconditionError) as caught:
        violate()
    assert caught.value.rank == 0, str(caught.value)
    assert str(caught.value).endswith(", rank 0)"), str(caught.value)


def _rejected_extension(declared, carried) -> PreconditionError:
    with pytest.raises(PreconditionError) as caught:
        _gather_extensions(declared, carried)
    assert caught.value.precondition_id == "PRE-EXTENSION-FIELDS" and caught.value.rank == 0, str(caught.value)
    return caught.value


def test_undeclared_extension_field_is_named():
    error = _rejected_extension({}, lambda local: {"extra": torch.zeros(local.num_logits, 4, dtype=torch.int32)})
    assert error.field == "extensions.extra"


@pytest.mark.parametrize(
    "carried",
    [
        pytest.param(lambda local: {}, id="declared-but-missing"),
        pytest.param(lambda local: {"mask": torch.zeros(local.num_logits, 4, dtype=torch.int64)}, id="wrong-dtype"),
        pytest.param(lambda local: {"mask": torch.zeros(local.num_logits, 3, dtype=torch.int32)}, id="wrong-shape"),
    ],
)
def test_declared_extension_field_is_named(carried):
    assert _rejected_extension({"mask": MASK}, carried).field == "extensions.mask"


def _gather_on_idle_rank(declared, carried):
    """Rank 1 of 2 owns none of these requests (by slot or by position): it may leave declared fields out,
    not send them wrong."""
    batch = build_input_batch([2], [1])
    sharder = ReferenceSharder(8, 4, comm=LoopbackComm(1, 2))
    shard = sharder.shard_sampler_inputs(batch, None)
    empty = torch.zeros(0, 1, dtype=torch.int64)
    output = SamplerOutput(
        empty, None, None, torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), extensions=carried
    )
    return sharder.gather_sampler_output(output, shard.metadata, batch, shard.local_batch, extension_fields=declared)


def test_idle_rank_may_leave_out_a_declared_field():
    gathered = _gather_on_idle_rank({"mask": MASK}, {})
    assert gathered.extensions["mask"].shape == (1, 4)


def test_idle_rank_still_checks_the_fields_after_one_it_left_out():
    with pytest.raises(PreconditionError) as caught:
        _gather_on_idle_rank({"gone": MASK, "mask": MASK}, {"mask": torch.zeros(0, 4, dtype=torch.int64)})
    assert (caught.value.precondition_id, caught.value.field, caught.value.rank) == (
        "PRE-EXTENSION-FIELDS",
        "extensions.mask",
        1,
    )


# The message says what was found against what was declared (5 local logits rows, 3 local requests).
MESSAGES = {
    "undeclared": (
        {},
        lambda local: {"extra": torch.zeros(local.num_logits, 4, dtype=torch.int32)},
        "is not declared in extension_fields, so the gather would drop it (field extensions.extra, rank 0)",
    ),
    "missing": (
        {"mask": MASK},
        lambda local: {},
        "is declared but missing, and this rank owns 3 requests (field extensions.mask, rank 0)",
    ),
    "wrong-dtype": (
        {"mask": MASK},
        lambda local: {"mask": torch.zeros(local.num_logits, 4, dtype=torch.int64)},
        "is torch.int64 (5, 4); declared torch.int32 (5, 4) (field extensions.mask, rank 0)",
    ),
    "not-a-tensor": (
        {"mask": MASK},
        lambda local: {"mask": [[0]]},
        "is list (); declared torch.int32 (5, 4) (field extensions.mask, rank 0)",
    ),
}


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_extension_field_message_says_what_was_found_and_declared(name):
    declared, carried, message = MESSAGES[name]
    assert str(_rejected_extension(declared, carried)) == f"[PRE-EXTENSION-FIELDS] {message}"


def _all_to_all(make_shard) -> PreconditionError:
    """Shard rank 0 of 2, then hand all_to_all_logits ``make_shard(num_logits)`` as its logits shard."""
    batch = build_input_batch(SLOTS, COUNTS)
    sharder = ReferenceSharder(8, 4, comm=LoopbackComm(0, 2))
    metadata = sharder.shard_sampler_inputs(batch, None).metadata
    with pytest.raises(PreconditionError) as caught:
        sharder.all_to_all_logits(make_shard(batch.num_logits), metadata)
    return caught.value


@pytest.mark.parametrize(
    ("make_shard", "message"),
    [
        pytest.param(
            lambda n: torch.zeros(n, 8, dtype=torch.int32), "is torch.int32, not a floating point tensor", id="integer"
        ),
        pytest.param(lambda n: [[0.0] * 8] * n, "is list, not a floating point tensor", id="not-a-tensor"),
        pytest.param(lambda n: torch.zeros(n), "shape (9,); expected (9, Vs) with Vs >= 1", id="one-dim"),
        pytest.param(lambda n: torch.zeros(n, 0), "shape (9, 0); expected (9, Vs) with Vs >= 1", id="no-columns"),
    ],
)
def test_logits_shard_rejection_says_what_was_given(make_shard, message):
    error = _all_to_all(make_shard)
    assert str(error) == f"[PRE-LOGITS-SHARD] {message} (field logits_shard, rank 0)"


def _with_logprobs(local, **fields):
    output = _output(local)
    return replace(output, logprobs_tensors=output.logprobs_tensors._replace(**fields))


# Rank 0 of 2 owns 3 of the 5 requests, with 5 logits rows. (make_output, logprobs_dims, field, message)
LOCAL_OUTPUT_REJECTIONS = {
    "logprobs-dims-negative": (_output, (2, -1), "logprobs_dims", "(2, -1) is not a pair of non-negative ints"),
    "logprobs-dims-three": (_output, (1, 2, 3), "logprobs_dims", "(1, 2, 3) is not a pair of non-negative ints"),
    "none-while-owning": (lambda local: None, None, "local_output", "is None but this rank owns 3 requests"),
    "ids-rows": (
        lambda local: replace(_output(local), sampled_token_ids=torch.zeros(2, 2, dtype=torch.int64)),
        None,
        "sampled_token_ids",
        "shape (2, 2); expected (3, width)",
    ),
    "ids-one-dim": (
        lambda local: replace(_output(local), sampled_token_ids=torch.zeros(3, dtype=torch.int64)),
        None,
        "sampled_token_ids",
        "shape (3,); expected (3, width)",
    ),
    "num-sampled-none": (
        lambda local: replace(_output(local), num_sampled=None),
        None,
        "num_sampled",
        "is None; expected shape (3,)",
    ),
    "num-rejected-rows": (
        lambda local: replace(_output(local), num_rejected=torch.zeros(4, dtype=torch.int32)),
        None,
        "num_rejected",
        "is (4,); expected shape (3,)",
    ),
    "nans-none": (
        lambda local: replace(_output(local), num_nans=None),
        None,
        "num_nans",
        "is None; gather_num_nans needs one count per local logits row (5,)",
    ),
    "nans-per-request": (
        lambda local: replace(_output(local), num_nans=torch.zeros(3, dtype=torch.int32)),
        None,
        "num_nans",
        "is (3,); gather_num_nans needs one count per local logits row (5,)",
    ),
    "logprob-ids-rows": (
        lambda local: _with_logprobs(local, logprob_token_ids=torch.zeros(4, 3, dtype=torch.int64)),
        (2, 0),
        "logprob_token_ids",
        "shape (4, 3); expected (5, columns)",
    ),
    "logprobs-one-dim": (
        lambda local: _with_logprobs(local, logprobs=torch.zeros(5)),
        (2, 0),
        "logprobs",
        "shape (5,); expected (5, columns)",
    ),
    "logprobs-columns": (
        lambda local: _with_logprobs(local, logprobs=torch.zeros(5, 2)),
        (2, 0),
        "logprobs",
        "logprob_token_ids and logprobs differ in shape",
    ),
    "ranks-rows": (
        lambda local: _with_logprobs(local, selected_token_ranks=torch.zeros(4, dtype=torch.int64)),
        (2, 0),
        "selected_token_ranks",
        "shape (4,)",
    ),
}


@pytest.mark.parametrize("name", sorted(LOCAL_OUTPUT_REJECTIONS))
def test_local_output_rejection_names_field_and_what_was_found(name):
    make_output, logprobs_dims, field, message = LOCAL_OUTPUT_REJECTIONS[name]
    with pytest.raises(PreconditionError) as caught:
        _gather(make_output, logprobs_dims=logprobs_dims)
    pid = "PRE-LOGPROBS-DIMS" if field == "logprobs_dims" else "PRE-LOCAL-OUTPUT"
    assert str(caught.value) == f"[{pid}] {message} (field {field}, rank 0)"


# (declarations, message): replicated, so every rank rejects them alike before any all-gather.
DECLARATION_REJECTIONS = {
    "name-not-str": ({1: MASK}, "entry 1 is not a str -> ExtensionSpec pair"),
    "not-a-spec": ({"mask": "int32"}, "entry 'mask' is not a str -> ExtensionSpec pair"),
    "kind": (
        {"mask": ExtensionSpec("token", torch.int32)},
        "mask: kind 'token' is not one of ('request', 'logits_row')",
    ),
    "dtype": ({"mask": ExtensionSpec("request", torch.complex64)}, "mask: dtype torch.complex64 is not supported"),
    "negative-size": (
        {"mask": ExtensionSpec("request", torch.int32, (2, -1))},
        "mask: trailing shape (2, -1) is not a tuple of sizes",
    ),
    "float-size": (
        {"mask": ExtensionSpec("request", torch.int32, (2.0,))},
        "mask: trailing shape (2.0,) is not a tuple of sizes",
    ),
}


@pytest.mark.parametrize("name", sorted(DECLARATION_REJECTIONS))
def test_unsupported_declaration_says_which_and_why(name):
    declared, message = DECLARATION_REJECTIONS[name]
    with pytest.raises(PreconditionError) as caught:
        _gather_extensions(declared, lambda local: {})
    assert str(caught.value) == f"[PRE-EXTENSION-SUPPORTED] {message} (field extension_fields, rank 0)"


def test_zero_trailing_size_is_a_size():
    spec = ExtensionSpec("request", torch.int32, (0,))
    gathered = _gather_on_idle_rank({"empty": spec}, {})
    assert gathered.extensions["empty"].shape == (1, 0)


# Every branch of PRE-DRAFTS (5 requests of 1, 3, 2, 1 and 2 rows): (batch, field, request, message).
DRAFT_REJECTIONS = {
    "none-with-several-rows": (
        lambda: _batch(num_draft_tokens_per_req=None, num_draft_tokens=0),
        "num_draft_tokens_per_req",
        1,
        "is None, so every request must have exactly 1 logits row",
    ),
    "none-with-a-count": (
        lambda: replace(build_input_batch([4, 1, 6], [1, 1, 1]), num_draft_tokens_per_req=None, num_draft_tokens=2),
        "num_draft_tokens",
        None,
        "is 2 without num_draft_tokens_per_req",
    ),
    "shape": (
        lambda: _batch(num_draft_tokens_per_req=np.zeros(4, np.int32)),
        "num_draft_tokens_per_req",
        None,
        "shape (4,), expected (5,)",
    ),
    "off-by-one": (
        _drafts_off_by_one,
        "num_draft_tokens_per_req",
        3,
        "a request's logits rows must be 1 + its draft tokens",
    ),
    "sum": (
        lambda: _batch(num_draft_tokens=1),
        "num_draft_tokens",
        None,
        "is 1, but num_draft_tokens_per_req sums to 4",
    ),
}


@pytest.mark.parametrize("name", sorted(DRAFT_REJECTIONS))
def test_draft_rejection_names_field_request_and_what_was_found(name):
    make_batch, field, request, message = DRAFT_REJECTIONS[name]
    with pytest.raises(PreconditionError) as caught:
        _shard(make_batch())
    where = f"field {field}" + ("" if request is None else f", request {request}") + ", rank 0"
    assert str(caught.value) == f"[PRE-DRAFTS] {message} ({where})"


def _batch_with(name, edit):
    """The test batch with tensor ``name`` replaced by ``edit(tensor)``."""
    batch = build_input_batch(SLOTS, COUNTS)
    return replace(batch, **{name: edit(getattr(batch, name))})


def _batch_of_one_with(name, edit):
    """A batch of one request (slot 3, one row) with tensor ``name`` replaced by ``edit(tensor)``."""
    batch = build_input_batch([3], [1])
    return replace(batch, **{name: edit(getattr(batch, name))})


# Input-batch rejections (5 requests of 1, 3, 2, 1 and 2 rows; capacity 8 requests, 4 rows each):
# (batch, capacity overrides, precondition, field, request, message).
BATCH_REJECTIONS = {
    "batch-size": (
        lambda: _batch(num_reqs=4),
        {},
        "PRE-BATCH-SIZE",
        "num_reqs",
        None,
        "num_reqs=4 but 5 req_ids and idx_mapping_np of shape (5,)",
    ),
    "capacity-reqs": (
        lambda: build_input_batch(SLOTS, COUNTS),
        {"max_num_reqs": 4},
        "PRE-CAPACITY-REQS",
        "num_reqs",
        None,
        "5 requests exceed the sharder's capacity max_num_reqs=4",
    ),
    "req-ids": (
        lambda: _batch(req_ids=["a", "b", "c", "b", "e"]),
        {},
        "PRE-REQ-IDS-UNIQUE",
        "req_ids",
        3,
        "request ids are not unique",
    ),
    "host-slots-float": (
        lambda: _batch(idx_mapping_np=np.array(SLOTS, np.float64)),
        {},
        "PRE-DTYPES",
        "idx_mapping_np",
        None,
        "dtype float64 is not an integer type",
    ),
    "slot-range": (
        lambda: build_input_batch([4, 1, 8], [1, 1, 1]),
        {},
        "PRE-SLOT-RANGE",
        "idx_mapping",
        2,
        "slot 8 is outside [0, 8)",
    ),
    "slot-shared": (
        lambda: build_input_batch([4, 1, 4], [1, 1, 1], req_ids=["a", "b", "c"]),
        {},
        "PRE-SLOT-UNIQUE",
        "idx_mapping",
        2,
        "two requests share a slot",
    ),
    "slots-float": (
        lambda: _batch(idx_mapping=torch.tensor(SLOTS, dtype=torch.float32)),
        {},
        "PRE-DTYPES",
        "idx_mapping",
        None,
        "dtype torch.float32 is not int32/int64",
    ),
    "slots-device-copy": (
        lambda: _batch_with("idx_mapping", lambda t: t.index_fill(0, torch.tensor([1]), 7)),
        {},
        "PRE-HOST-DEVICE-MATCH",
        "idx_mapping",
        1,
        "device copy differs from idx_mapping_np",
    ),
    "cu-shape": (
        lambda: _batch(cu_num_logits_np=np.array([0, 1, 4, 6, 7], np.int32)),
        {},
        "PRE-CU-LOGITS",
        "cu_num_logits_np",
        None,
        "shape (5,), expected (6,)",
    ),
    "zero-rows": (
        lambda: build_input_batch([4, 1, 6], [2, 0, 1]),
        {},
        "PRE-LOGITS-PER-REQ",
        "cu_num_logits",
        1,
        "request has 0 logits rows; at least 1 is required",
    ),
    "capacity-rows": (
        lambda: build_input_batch(SLOTS, COUNTS),
        {"max_num_logits_per_req": 2},
        "PRE-CAPACITY-LOGITS",
        "cu_num_logits",
        1,
        "request has 3 logits rows, more than the sharder's capacity max_num_logits_per_req=2",
    ),
    "cu-float": (
        lambda: _batch_with("cu_num_logits", lambda t: t.float()),
        {},
        "PRE-DTYPES",
        "cu_num_logits",
        None,
        "dtype torch.float32 is not int32/int64",
    ),
    "cu-device-copy": (
        lambda: _batch_with("cu_num_logits", lambda t: t + torch.arange(6, dtype=t.dtype)),
        {},
        "PRE-HOST-DEVICE-MATCH",
        "cu_num_logits",
        None,
        "device copy differs from cu_num_logits_np",
    ),
    "query-start-shape": (
        lambda: _batch_with("query_start_loc", lambda t: t[:-1]),
        {},
        "PRE-QUERY-START-LOC",
        "query_start_loc",
        None,
        "shape (5,) or start [0] is not (6,) from 0",
    ),
    "cu-start": (
        lambda: _batch(cu_num_logits_np=np.array([1, 1, 4, 6, 7, 9], np.int32)),
        {},
        "PRE-CU-LOGITS",
        "cu_num_logits_np",
        None,
        "starts at 1, not 0",
    ),
    "query-start-one-request": (
        lambda: _batch_of_one_with("query_start_loc", lambda t: t + 1),
        {},
        "PRE-QUERY-START-LOC",
        "query_start_loc",
        None,
        "shape (2,) or start [1] is not (2,) from 0",
    ),
    "query-shorter": (
        lambda: _batch_with("query_start_loc", lambda t: t.index_fill(0, torch.tensor([3]), int(t[2]))),
        {},
        "PRE-QUERY-START-LOC",
        "query_start_loc",
        2,
        "query is shorter than the request's logits rows (or decreasing)",
    ),
    "indices-shape": (
        lambda: _batch_with("logits_indices", lambda t: t[:-1]),
        {},
        "PRE-FIELD-SHAPES",
        "logits_indices",
        None,
        "shape (8,), expected (9,)",
    ),
    "logits-tail": (
        lambda: _batch_with("logits_indices", lambda t: t - (torch.arange(9) == 4).to(t.dtype)),
        {},
        "PRE-LOGITS-TAIL",
        "logits_indices",
        2,
        "logits rows must be the last n_i tokens of each request's query",
    ),
    "draft-counts-float": (
        lambda: _batch(num_draft_tokens_per_req=np.array([0, 2, 1, 0, 1], np.float64)),
        {},
        "PRE-DTYPES",
        "num_draft_tokens_per_req",
        None,
        "dtype float64 is not an integer type",
    ),
    "expanded-slots": (
        lambda: _batch_with("expanded_idx_mapping", lambda t: t + (torch.arange(9) == 0).to(t.dtype)),
        {},
        "PRE-EXPANDED",
        "expanded_idx_mapping",
        0,
        "expanded_idx_mapping disagrees with idx_mapping/cu_num_logits",
    ),
}


@pytest.mark.parametrize("name", sorted(BATCH_REJECTIONS))
def test_input_batch_rejection_names_field_request_and_what_was_found(name):
    make_batch, capacity, pid, field, request, message = BATCH_REJECTIONS[name]
    with pytest.raises(PreconditionError) as caught:
        _shard(make_batch(), **capacity)
    where = f"field {field}" + ("" if request is None else f", request {request}") + ", rank 0"
    assert str(caught.value) == f"[{pid}] {message} ({where})"


def test_batch_at_exactly_the_capacity_is_accepted():
    shard = _shard(build_input_batch([4, 1, 2, 3, 0], COUNTS), max_num_reqs=5, max_num_logits_per_req=3)
    assert shard.metadata.num_logits_per_rank == [5, 4]


def _grammar_for(edit):
    """The test batch and its grammar output for requests 2 and 0 (3 rows), edited by ``edit``."""
    batch = build_input_batch(SLOTS, COUNTS)
    grammar = build_grammar_output(batch, [2, 0], 100)
    return batch, edit(grammar)


GRAMMAR_REJECTIONS = {
    "unknown-id": (
        lambda g: replace(g, structured_output_request_ids=[g.structured_output_request_ids[0], "nope"]),
        "PRE-GRAMMAR-IDS",
        "structured_output_request_ids",
        None,
        "entry 1 ('nope') is not in the batch",
    ),
    "repeated-id": (
        lambda g: replace(g, structured_output_request_ids=g.structured_output_request_ids * 2),
        "PRE-GRAMMAR-IDS",
        "structured_output_request_ids",
        2,
        "entry 2 repeats a request id",
    ),
    "bitmask-rows": (
        lambda g: replace(g, grammar_bitmask=g.grammar_bitmask[:-1]),
        "PRE-GRAMMAR-BITMASK",
        "grammar_bitmask",
        None,
        "shape (2, 4); expected 3 rows (one per logits row of the listed requests)",
    ),
    "bitmask-one-dim": (
        lambda g: replace(g, grammar_bitmask=g.grammar_bitmask[0]),
        "PRE-GRAMMAR-BITMASK",
        "grammar_bitmask",
        None,
        "shape (4,); expected 3 rows (one per logits row of the listed requests)",
    ),
}


@pytest.mark.parametrize("name", sorted(GRAMMAR_REJECTIONS))
def test_grammar_rejection_names_field_request_and_what_was_found(name):
    edit, pid, field, request, message = GRAMMAR_REJECTIONS[name]
    batch, grammar = _grammar_for(edit)
    with pytest.raises(PreconditionError) as caught:
        _shard(batch, grammar, profile=VLLM_SEED)  # one bitmask row per logits row
    where = f"field {field}" + ("" if request is None else f", request {request}") + ", rank 0"
    assert str(caught.value) == f"[{pid}] {message} ({where})"


def test_logits_shard_one_column_wide_is_accepted():
    batch = build_input_batch(SLOTS, COUNTS)
    sharder = ReferenceSharder(8, 4, comm=LoopbackComm(0, 2))
    metadata = sharder.shard_sampler_inputs(batch, None).metadata
    assert sharder.all_to_all_logits(torch.zeros(batch.num_logits, 1), metadata).shape == (5, 2)
