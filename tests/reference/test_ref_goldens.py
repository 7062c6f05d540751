"""The reference reproduces every fixture's golden, rank by rank.

The shard plan needs no communication, so each rank's shard result is checked
on its own. Whole steps (all-to-all, sampler, gather, wire) are checked against
the goldens once, by the drift check (tests/fixtures/test_fixture_catalogue.py),
under every profile.
"""

import functools

import numpy as np
import pytest
import torch

from shardspec.fixtures import load_cases
from shardspec.fixtures import load_golden as _load_golden
from shardspec.fixtures.golden import encode_shard
from shardspec.fixtures.run import expected_error, run_reference_case, shard_rank
from shardspec.spec.case import build_case_inputs

CASES = load_cases()
STEP_CASES = [case for case in CASES if case.expect_error is None]
ERROR_CASES = [case for case in CASES if case.expect_error is not None]
# Several tests read one golden; parse it once per worker (tests only read it).
load_golden = functools.cache(_load_golden)
RANKS = [(case, rank) for case in STEP_CASES for rank in range(case.tp_size)]


@pytest.mark.parametrize(("case", "rank"), RANKS, ids=[f"{c.case_id}/rank{r}" for c, r in RANKS])
def test_shard_of_one_rank_alone_matches_golden(case, rank):
    golden = load_golden(case.case_id)["ranks"][rank]
    shard = shard_rank(case, build_case_inputs(case), rank)
    assert encode_shard(shard) == golden["shard"]


@pytest.mark.parametrize("case", STEP_CASES, ids=lambda c: c.case_id)
def test_all_to_all_rows_come_from_the_owned_tokens(case):
    """Every column block of every full-vocab row is the right token's block."""
    golden = load_golden(case.case_id)["ranks"]
    for rank_golden in golden:
        tokens = rank_golden["shard"]["local_batch"]["logits_indices"]["values"]
        expected = [[token] * case.tp_size for token in tokens]
        assert rank_golden["all_to_all"]["source_tokens"] == expected, f"rank {rank_golden['rank']}"


@pytest.mark.parametrize("case", STEP_CASES, ids=lambda c: c.case_id)
def test_wire_sequence_is_the_same_on_every_rank(case):
    expected = ["logits", "sampled"] + (["logprob_ids", "logprobs"] if case.logprobs_dims is not None else [])
    expected += [f"extension:{name}" for name in case.extensions]
    shapes = None
    for rank_golden in load_golden(case.case_id)["ranks"]:
        wire = rank_golden["wire"]
        assert [call["name"] for call in wire] == expected, f"rank {rank_golden['rank']}"
        gather_shapes = [(call["send"]["dtype"], call["send"]["shape"]) for call in wire[1:]]
        assert shapes in (None, gather_shapes), f"rank {rank_golden['rank']}: all-gather shapes differ"
        shapes = gather_shapes


def _snapshot(inputs):
    tensors = [value for value in vars(inputs.batch).values() if isinstance(value, torch.Tensor)]
    tensors += [value for value in vars(inputs.batch).values() if isinstance(value, np.ndarray)]
    if inputs.grammar is not None:
        tensors.append(inputs.grammar.grammar_bitmask)
    tensors.append(inputs.token_logits)
    return [value.clone() if isinstance(value, torch.Tensor) else value.copy() for value in tensors]


@pytest.mark.parametrize("case", STEP_CASES, ids=lambda c: c.case_id)
def test_step_leaves_its_inputs_unchanged(case):
    inputs = build_case_inputs(case)
    before = _snapshot(inputs)
    run_reference_case(case, inputs)
    for old, new in zip(before, _snapshot(inputs), strict=False):
        if isinstance(old, torch.Tensor):
            assert torch.equal(old.nan_to_num(), new.nan_to_num()) and old.dtype == new.dtype
        else:
            assert np.array_equal(old, new) and old.dtype == new.dtype


@pytest.mark.parametrize("case", ERROR_CASES, ids=lambda c: c.case_id)
def test_violating_case_raises_the_recorded_error(case):
    golden = load_golden(case.case_id)["error"]
    rank, error = expected_error(case)
    assert error.precondition_id == case.expect_error == golden["precondition_id"]
    assert (error.field, error.request, rank) == (golden["field"], golden["request"], golden["rank"])
    assert f"[{case.expect_error}]" in str(error)
