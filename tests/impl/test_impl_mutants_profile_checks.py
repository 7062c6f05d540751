"""vllm-0.33's host checks called one by one (impl/profile_checks.py, and where impl/checks.py uses
them): the whole error text, compared with the reference's where both reject, and the edges an
end-to-end run does not reach (an empty batch, counts past float64's exact integers, a block equal
to a request's rows). Errors are raised on rank 1, so that a dropped rank shows.
"""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from bundled import VLLM_033, VLLM_SEED

from shardspec.impl import checks, profile_checks
from shardspec.reference import profile_rules
from shardspec.spec.builders import build_grammar_output, build_input_batch
from shardspec.spec.errors import PreconditionError
from shardspec.spec.profiles import rules_of

SLOTS = [4, 1, 6, 3, 0]
SCHEDULED = [3, 2, 4, 1, 3]
ADMITTED = [1, 0, 2, 0, 2]
BIG = 2**53  # float64 holds BIG but not BIG + 1: a count read through a float would lose the 1


def _admitted(**overrides):
    batch = build_input_batch(SLOTS, SCHEDULED, admitted_drafts=ADMITTED, seq_lens_upper_bound=True)
    return replace(batch, **overrides)


def _raised(check, *args, **kwargs) -> PreconditionError:
    with pytest.raises(PreconditionError) as caught:
        check(*args, **kwargs)
    return caught.value


def _as_reference_does(production, reference) -> PreconditionError:
    """Both reject with the same text; returns production's error."""
    got, expected = _raised(*production), _raised(*reference)
    assert (str(got), got.field, got.request, got.rank) == (str(expected), expected.field, expected.request, 1)
    return got


ADMITTED_VIOLATIONS = {
    "without-drafts": lambda: _admitted(num_draft_tokens_per_req=None),
    "float": lambda: _admitted(num_admitted_draft_tokens=np.array(ADMITTED, np.float32)),
    "bool": lambda: _admitted(num_admitted_draft_tokens=np.array(ADMITTED, bool)),
    "short": lambda: _admitted(num_admitted_draft_tokens=np.array(ADMITTED[:-1], np.int32)),
    "above-scheduled": lambda: _admitted(num_admitted_draft_tokens=np.array([1, 0, 2, 1, 2], np.int32)),
    "negative": lambda: _admitted(num_admitted_draft_tokens=np.array([1, -1, 2, 0, 2], np.int64)),
    # Equal as float64, one apart as int64: the comparison must not go through floats.
    "above-scheduled-past-float": lambda: SimpleNamespace(
        num_reqs=1,
        num_admitted_draft_tokens=np.array([BIG + 1], np.int64),
        num_draft_tokens_per_req=np.array([BIG], np.int64),
    ),
}


@pytest.mark.parametrize("name", sorted(ADMITTED_VIOLATIONS))
def test_admitted_drafts_are_rejected_with_the_references_text(name):
    batch = ADMITTED_VIOLATIONS[name]()
    error = _as_reference_does(
        (profile_checks.check_admitted_drafts, batch, 1), (profile_rules.check_admitted_drafts, batch, 1)
    )
    assert (error.precondition_id, error.field) == ("PRE-DRAFTS", "num_admitted_draft_tokens")


def test_admitted_drafts_past_float_precision_name_the_count():
    error = _raised(profile_checks.check_admitted_drafts, ADMITTED_VIOLATIONS["above-scheduled-past-float"](), 1)
    assert str(error) == (
        f"[PRE-DRAFTS] {BIG + 1} admitted drafts, outside [0, {BIG}] scheduled "
        "(field num_admitted_draft_tokens, request 0, rank 1)"
    )


def test_drafts_of_another_shape_are_named_with_their_shape():
    """The reference leaves this to its PRE-DRAFTS of the scheduled counts; production names it here."""
    batch = _admitted(num_draft_tokens_per_req=np.array([2, 1, 3, 0], np.int32))
    error = _raised(profile_checks.check_admitted_drafts, batch, 1)
    assert str(error) == "[PRE-DRAFTS] shape (4,), expected (5,) (field num_draft_tokens_per_req, rank 1)"


@pytest.mark.parametrize(
    "admitted", [np.array(ADMITTED, np.uint8), np.array(ADMITTED, np.int64), np.array([2, 1, 3, 0, 2], np.uint64)]
)
def test_admitted_counts_of_any_integer_dtype_within_the_drafts_pass(admitted):
    assert profile_checks.check_admitted_drafts(_admitted(num_admitted_draft_tokens=admitted), 1) is None


BOUND_VIOLATIONS = {
    "short": torch.ones(4, dtype=torch.int32),
    "2d": torch.ones(5, 1, dtype=torch.int32),
    "meta": torch.ones(5, dtype=torch.int32, device="meta"),
    "numpy": np.ones(5, np.int32),  # has a shape, but is not a tensor
    "list": [1, 1, 1, 1, 1],  # has no shape at all
}
BOUND_MESSAGES = {
    "short": "cpu, shape (4,)",
    "2d": "cpu, shape (5, 1)",
    "meta": "meta, shape (5,)",
    "numpy": "ndarray, shape (5,)",
    "list": "list, shape ()",
}


@pytest.mark.parametrize("name", sorted(BOUND_VIOLATIONS))
def test_a_bad_seq_lens_bound_is_rejected_with_the_references_text(name):
    batch = _admitted(seq_lens_cpu_upper_bound=BOUND_VIOLATIONS[name])
    error = _as_reference_does(
        (profile_checks.check_seq_lens_upper_bound, batch, 1), (profile_rules.check_seq_lens_upper_bound, batch, 1)
    )
    assert str(error) == (
        f"[PRE-SEQ-LENS-UPPER-BOUND] {BOUND_MESSAGES[name]}: expected a CPU tensor of shape (5,) "
        "(field seq_lens_cpu_upper_bound, rank 1)"
    )


def _grammar(rows=4, positions=(2, 0, 3), **overrides):
    batch = _admitted()
    grammar = build_grammar_output(batch, list(positions), 100, block_rows=rows)
    return replace(grammar, **overrides), batch


def _position(batch) -> dict:
    return {req_id: i for i, req_id in enumerate(batch.req_ids)}


GRAMMAR_VIOLATIONS = {
    "acceptable-long": (
        {"num_acceptable_drafts": [0, 1, 2, 3]},
        "[PRE-GRAMMAR-BITMASK] 4 entries for 3 listed requests (field num_acceptable_drafts, rank 1)",
    ),
    "rows-not-blocks": (
        {"grammar_bitmask": torch.zeros(11, 4, dtype=torch.int32)},
        "[PRE-GRAMMAR-BITMASK] 11 rows are not a block per each of 3 listed requests (field grammar_bitmask, rank 1)",
    ),
    "bitmask-1d": (
        {"grammar_bitmask": torch.zeros(12, dtype=torch.int32)},
        "[PRE-GRAMMAR-BITMASK] shape (12,): expected [G * S, B] (field grammar_bitmask, rank 1)",
    ),
}


@pytest.mark.parametrize("name", sorted(GRAMMAR_VIOLATIONS))
def test_grammar_blocks_of_a_bad_shape_are_rejected_with_the_references_text(name):
    overrides, message = GRAMMAR_VIOLATIONS[name]
    grammar, batch = _grammar(**overrides)
    error = _as_reference_does(
        (profile_checks.check_grammar_blocks, grammar, batch, _position(batch), 1),
        (profile_rules.check_grammar_blocks, grammar, batch, 1),
    )
    assert str(error) == message


def test_the_first_listed_request_longer_than_a_block_is_named_not_one_that_fills_it():
    # Blocks of 3 rows: request 0 (listed first) fills one exactly, request 2 (listed second) has 4.
    grammar, batch = _grammar(rows=3, positions=(0, 2, 3))
    error = _raised(profile_checks.check_grammar_blocks, grammar, batch, _position(batch), 1)
    assert str(error) == (
        "[PRE-GRAMMAR-BITMASK] S = 3 rows per block, but request 'req-6' has 4 logits rows "
        "(field grammar_bitmask, request 2, rank 1)"
    )
    assert error.request == _raised(profile_rules.check_grammar_blocks, grammar, batch, 1).request


def test_scheduled_rows_past_float_precision_are_counted_exactly():
    batch = SimpleNamespace(cu_num_logits_np=np.array([0, BIG + 1], np.int64), req_ids=["r"])
    grammar = SimpleNamespace(
        structured_output_request_ids=["r"], grammar_bitmask=torch.zeros(1, 1), num_acceptable_drafts=None
    )
    error = _raised(profile_checks.check_grammar_blocks, grammar, batch, {"r": 0}, 1)
    assert str(error) == (
        f"[PRE-GRAMMAR-BITMASK] S = 1 rows per block, but request 'r' has {BIG + 1} logits rows "
        "(field grammar_bitmask, request 0, rank 1)"
    )


LIMITS = dict(max_num_reqs=8, max_num_logits_per_req=4, rules=rules_of(VLLM_033))


def _empty_admitted():
    return build_input_batch([], [], admitted_drafts=[])


def test_an_empty_batch_with_admitted_counts_is_one_row_wide():
    for check in (checks.check_input_batch, checks.check_guards):
        cu, counts, width = check(_empty_admitted(), rank=1, **LIMITS)
        assert (cu.tolist(), counts.tolist(), width) == ([0], [], 1)


def test_the_guards_reject_bad_admitted_counts_on_the_rank_given():
    batch = _admitted(num_admitted_draft_tokens=np.array([1, 0, 2, 1, 2], np.int32))
    error = _raised(checks.check_guards, batch, rank=1, **LIMITS)
    assert str(error) == (
        "[PRE-DRAFTS] 1 admitted drafts, outside [0, 0] scheduled (field num_admitted_draft_tokens, request 3, rank 1)"
    )


def test_a_device_copy_of_the_scheduled_sums_is_named_against_the_admitted_ones():
    scheduled = torch.tensor(np.cumsum([0, *SCHEDULED]), dtype=torch.int32)
    error = _raised(
        checks.check_input_batch, _admitted(cu_num_logits=scheduled), rank=1, compare_device_copies=True, **LIMITS
    )
    assert str(error) == (
        "[PRE-HOST-DEVICE-MATCH] device copy differs from the admitted rows' prefix sums at entry 1: 3 != 2 "
        "(field cu_num_logits, rank 1)"
    )


def test_a_wrong_draft_total_names_the_admitted_counts():
    error = _raised(checks.check_input_batch, _admitted(num_draft_tokens=6), rank=1, **LIMITS)
    assert str(error) == ("[PRE-DRAFTS] is 6, but num_admitted_draft_tokens sums to 5 (field num_draft_tokens, rank 1)")


def test_vllm_seed_with_no_listed_requests_expects_no_bitmask_rows():
    """vllm-seed's counterpart of the blocks: a row per logits row of the listed requests, so none."""
    batch = build_input_batch(SLOTS, SCHEDULED)
    position, counts = _position(batch), np.array(SCHEDULED)
    empty = SimpleNamespace(structured_output_request_ids=[], grammar_bitmask=torch.zeros(0, 4, dtype=torch.int32))
    assert checks.check_grammar_output(empty, batch, position, counts, 1, rules_of(VLLM_SEED)) is None
    one_row = SimpleNamespace(structured_output_request_ids=[], grammar_bitmask=torch.zeros(1, 4, dtype=torch.int32))
    error = _raised(checks.check_grammar_output, one_row, batch, position, counts, 1, rules_of(VLLM_SEED))
    assert str(error) == (
        "[PRE-GRAMMAR-BITMASK] shape (1, 4); expected 0 rows (one per logits row of the listed requests) "
        "(field grammar_bitmask, rank 1)"
    )
