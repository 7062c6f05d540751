"""Upstream's gather tests and end-to-end transparency, against the reference.

Local sampler outputs are written out per rank (Case.local_outputs) with
values that encode where they came from, so every gathered entry can be
checked against a formula: ids of request i are 1000*i + column + 1; logprob
ids of row p of request i are 100*i + 10*p + column + 1.
"""

import math

import numpy as np
import pytest
import torch
from bundled import profile_for_tp

from shardspec.conformance.harness.expectations import replicated_of
from shardspec.fixtures import load_cases
from shardspec.fixtures.run import run_reference_case
from shardspec.spec.case import Case, ExplicitLocalOutput, build_case_inputs
from shardspec.spec.model import DEFAULT_PROFILE, num_logprob_columns, rules_of

SLOTS = [5, 2, 9, 0, 7, 3, 11, 4]
COUNTS = [1, 3, 2, 4, 1, 2, 3, 1]


def _owners(tp, slots=SLOTS):
    """Each request's owner under the default profile's owner rule (the cases take the default)."""
    return rules_of(DEFAULT_PROFILE).owners(slots, tp)


def _logprob_value(i, p, c):
    return -(i + p / 4 + c / 8)  # exact in float32


def _explicit_outputs(tp, id_width, lp_cols, slots=SLOTS, counts=COUNTS):
    """Per-rank outputs; ``id_width(rank)`` ids per request, ``lp_cols(rank)`` logprob columns or None."""
    outputs = {}
    owners = _owners(tp, slots)
    for rank in range(tp):
        owned = [i for i, owner in enumerate(owners) if owner == rank]
        if not owned:
            continue
        rows = [(i, p) for i in owned for p in range(counts[i])]
        cols = lp_cols(rank)
        logprobs = {}
        if cols is not None:
            logprobs = dict(
                logprob_token_ids=[[100 * i + 10 * p + c + 1 for c in range(cols)] for i, p in rows],
                logprobs=[[_logprob_value(i, p, c) for c in range(cols)] for i, p in rows],
                selected_token_ranks=[i + p for i, p in rows],
            )
        outputs[rank] = ExplicitLocalOutput(
            sampled_token_ids=[[1000 * i + c + 1 for c in range(id_width(rank))] for i in owned],
            num_sampled=[counts[i] - i % 2 if counts[i] > 1 else 1 for i in owned],
            num_rejected=[i % 2 if counts[i] > 1 else 0 for i in owned],
            num_nans=[(i + p) % 3 for i, p in rows],
            **logprobs,
        )
    return outputs


def _run(tp, id_width, lp_cols, logprobs_dims=(2, 0), slots=SLOTS, counts=COUNTS):
    case = Case(
        case_id="gather",
        tp_size=tp,
        slots=slots,
        num_logits_per_req=counts,
        logprobs_dims=logprobs_dims,
        local_outputs=_explicit_outputs(tp, id_width, lp_cols, slots, counts),
    )
    gathered = [trace.gathered for trace in run_reference_case(case)]
    return case, gathered


def _assert_identical_on_every_rank(gathered):
    first = gathered[0]
    for rank, out in enumerate(gathered[1:], 1):
        assert torch.equal(out.sampled_token_ids, first.sampled_token_ids), f"rank {rank}"
        for name in ("num_sampled", "num_rejected", "num_nans"):
            assert torch.equal(getattr(out, name), getattr(first, name)), f"rank {rank}: {name}"
        if first.logprobs_tensors is not None:
            for a, b in zip(out.logprobs_tensors[:3], first.logprobs_tensors[:3], strict=False):
                assert torch.equal(a, b), f"rank {rank}: logprobs"


WIDTHS = {
    "narrow": lambda rank: 1,
    "exact": lambda rank: 4,
    "wide": lambda rank: 6,
    "mixed": lambda rank: 1 + rank * 2,
}


@pytest.mark.parametrize("tp", [2, 4], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("mode", sorted(WIDTHS))
def test_sampled_ids_are_zero_filled_or_truncated(tp, mode):
    _, gathered = _run(tp, WIDTHS[mode], lambda rank: 3)
    out = gathered[0]
    width = max(COUNTS)
    assert out.sampled_token_ids.dtype == torch.int64 and out.sampled_token_ids.shape == (len(SLOTS), width)
    for i, owner in enumerate(_owners(tp)):
        local_width = WIDTHS[mode](owner)
        expected = [1000 * i + c + 1 if c < local_width else 0 for c in range(width)]
        assert out.sampled_token_ids[i].tolist() == expected, f"request {i}"
    for name in ("num_sampled", "num_rejected", "num_nans"):
        assert getattr(out, name).dtype == torch.int32, name
    _assert_identical_on_every_rank(gathered)


def test_counts_and_nan_sums_per_request():
    case, gathered = _run(2, WIDTHS["exact"], lambda rank: 3)
    out = gathered[0]
    outputs = case.local_outputs
    owners = _owners(2)
    for i, owner in enumerate(owners):
        local = outputs[owner]
        j = [k for k, o in enumerate(owners) if o == owner].index(i)
        assert int(out.num_sampled[i]) == local.num_sampled[j]
        assert int(out.num_rejected[i]) == local.num_rejected[j]
        assert int(out.num_nans[i]) == sum((i + p) % 3 for p in range(COUNTS[i])), f"request {i}"


LOGPROB_COLUMNS = {
    "narrow": lambda rank: 1,
    "wide": lambda rank: 7,
    "missing-on-rank-1": lambda rank: None if rank == 1 else 3,
    "mixed": lambda rank: [2, 5, 3, 4][rank],
}


@pytest.mark.parametrize("mode", sorted(LOGPROB_COLUMNS))
@pytest.mark.parametrize("dims", [(2, 0), (1, 3)], ids=lambda d: f"k{d[0]}-t{d[1]}")
def test_logprobs_padded_truncated_or_missing(mode, dims):
    tp = 4 if mode == "mixed" else 2
    _, gathered = _run(tp, WIDTHS["exact"], LOGPROB_COLUMNS[mode], logprobs_dims=dims)
    lp = gathered[0].logprobs_tensors
    cols = num_logprob_columns(dims)
    num_logits = sum(COUNTS)
    assert lp.logprob_token_ids.dtype == torch.int64 and lp.logprob_token_ids.shape == (num_logits, cols)
    assert lp.logprobs.dtype == torch.float32 and lp.logprobs.shape == (num_logits, cols)
    assert lp.selected_token_ranks.dtype == torch.int64 and lp.selected_token_ranks.shape == (num_logits,)
    row = 0
    for i, owner in enumerate(_owners(tp)):
        local_cols = LOGPROB_COLUMNS[mode](owner)
        for p in range(COUNTS[i]):
            copied = 0 if local_cols is None else min(local_cols, cols)
            ids = [100 * i + 10 * p + c + 1 if c < copied else 0 for c in range(cols)]
            values = [_logprob_value(i, p, c) if c < copied else -math.inf for c in range(cols)]
            assert lp.logprob_token_ids[row].tolist() == ids, f"request {i} row {p}"
            assert lp.logprobs[row].tolist() == values, f"request {i} row {p}"
            assert int(lp.selected_token_ranks[row]) == (0 if local_cols is None else i + p)
            row += 1
    _assert_identical_on_every_rank(gathered)


@pytest.mark.parametrize(("counts", "spec"), [(COUNTS, True), ([1] * len(SLOTS), False)], ids=["spec", "no-spec"])
def test_cu_num_generated_tokens_iff_more_logits_than_requests(counts, spec):
    _, gathered = _run(2, lambda rank: max(counts), lambda rank: 3, counts=counts)
    cu = gathered[0].logprobs_tensors.cu_num_generated_tokens
    if spec:
        assert cu == [0, *np.cumsum(counts).tolist()]
    else:
        assert cu is None


def test_without_logprobs_or_nans_nothing_extra_is_gathered():
    case = Case(
        case_id="bare",
        tp_size=2,
        slots=SLOTS,
        num_logits_per_req=COUNTS,
        logprobs_dims=None,
        gather_num_nans=False,
        local_outputs=_explicit_outputs(2, WIDTHS["exact"], lambda rank: None),
    )
    traces = run_reference_case(case)
    for trace in traces:
        assert trace.gathered.logprobs_tensors is None and trace.gathered.num_nans is None
        assert [send.kind for send in trace.wire] == ["all_to_all_single", "all_gather_into_tensor"]
        assert trace.wire[1].send.shape == (trace.shard.metadata.max_num_reqs_per_rank, max(COUNTS) + 2)


TRANSPARENCY_BATCHES = {
    "spec-grammar-nans": dict(
        slots=SLOTS, num_logits_per_req=COUNTS, grammar_positions=[6, 1, 3], nan_tokens=[2, 5, 9]
    ),
    "decode": dict(slots=[3, 12, 1, 7, 0, 9], num_logits_per_req=[1] * 6, grammar_positions=[4, 0]),
    "one-request": dict(slots=[6], num_logits_per_req=[3]),
    "empty": dict(slots=[], num_logits_per_req=[]),
    "wider-token-ids": dict(slots=[2, 5, 8], num_logits_per_req=[2, 1, 2], logprobs_dims=(1, 4)),
}


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("batch", sorted(TRANSPARENCY_BATCHES))
def test_end_to_end_equals_the_replicated_path(tp, batch):
    case = Case(
        case_id=f"e2e-{batch}", tp_size=tp, seed=tp, rules=rules_of(profile_for_tp(tp)), **TRANSPARENCY_BATCHES[batch]
    )
    inputs = build_case_inputs(case)
    gathered = [trace.gathered for trace in run_reference_case(case, inputs)]
    expected = replicated_of(case, inputs)
    out = gathered[0]
    if expected is None:
        assert out.sampled_token_ids.shape[0] == 0 and out.num_sampled.shape == (0,)
        return
    for name in ("num_sampled", "num_rejected", "num_nans"):
        assert torch.equal(getattr(out, name), getattr(expected, name)), name
    assert bool(case.nan_tokens) == (int(expected.num_nans.sum()) > 0), "NaN rows must reach the sampler"
    for i, n in enumerate(expected.num_sampled.tolist()):
        assert torch.equal(out.sampled_token_ids[i, :n], expected.sampled_token_ids[i, :n]), f"request {i}"
    for a, b in zip(out.logprobs_tensors[:3], expected.logprobs_tensors[:3], strict=False):
        assert torch.equal(a, b)
    assert out.logprobs_tensors.cu_num_generated_tokens == expected.logprobs_tensors.cu_num_generated_tokens
    _assert_identical_on_every_rank(gathered)


TOY_FIXTURES = [case for case in load_cases() if case.local_outputs == "toy" and case.expect_error is None]


@pytest.mark.parametrize("case", TOY_FIXTURES, ids=lambda c: c.case_id)
def test_every_toy_fixture_equals_the_replicated_path(case):
    inputs = build_case_inputs(case)
    out = run_reference_case(case, inputs)[0].gathered
    expected = replicated_of(case, inputs)
    if expected is None:
        assert out.num_sampled.shape == (0,)
        return
    assert torch.equal(out.num_sampled, expected.num_sampled) and torch.equal(out.num_rejected, expected.num_rejected)
    assert (out.num_nans is None) == (expected.num_nans is None)
    if expected.num_nans is not None:
        assert torch.equal(out.num_nans, expected.num_nans)
    for i, n in enumerate(expected.num_sampled.tolist()):
        assert torch.equal(out.sampled_token_ids[i, :n], expected.sampled_token_ids[i, :n]), f"request {i}"
    assert (out.logprobs_tensors is None) == (expected.logprobs_tensors is None)
    if expected.logprobs_tensors is not None:
        rows = expected.logprobs_tensors.logprobs.shape[0]  # the admitted rows; those past them are unspecified
        for k, (a, b) in enumerate(zip(out.logprobs_tensors, expected.logprobs_tensors, strict=False)):
            a = a[:rows] if k < 3 else a  # the per-row tensors; then the prefix sums, list and tensor
            assert a == b if isinstance(b, (list, type(None))) else torch.equal(a, b)
