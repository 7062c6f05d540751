"""The default run's generated cases cover what engines send, at every group size.

These are the cases ``python -m shardspec.conformance`` generates by default
(100 per tp size, seed 0), so each property below holds in every default run.
"""

import functools

import pytest

from shardspec.conformance.cases.input_space import LARGE_BATCH
from shardspec.conformance.cases.strategies import INT32_MAX, INT64_MAX, generate_cases
from shardspec.spec.layouts import LOGITS_DTYPES, OFFSET, STRIDED
from shardspec.spec.profiles import rules_of

DEFAULT_COUNT, DEFAULT_SEED = 100, 0
TP_SIZES = [1, 2, 3, 4, 8]


@functools.cache
def default_cases(tp: int):
    # Under the main run's profile (noxfile.py), whose callers may send every view and dtype.
    return generate_cases(tp, DEFAULT_COUNT, DEFAULT_SEED, rules_of("vllm-0.34-strict"))


def _explicit_values(case):
    for out in case.local_outputs.values():
        yield from (v for row in out.sampled_token_ids for v in row)
        yield from out.num_sampled + out.num_rejected + (out.num_nans or [])
        yield from (out.selected_token_ranks or [])


@pytest.mark.parametrize("tp", TP_SIZES)
def test_dtypes_and_views(tp):
    cases = default_cases(tp)
    assert {case.logits_dtype for case in cases} == set(LOGITS_DTYPES)
    layouts = [set(case.layouts.values()) for case in cases]
    assert any(STRIDED in used for used in layouts) and any(OFFSET in used for used in layouts)
    assert any(not used for used in layouts), "some cases keep every input contiguous"
    every_field = [case for case in cases if len(case.layouts) >= 11]
    assert every_field, "some cases pass every batch field as a view"
    assert any("logits_shard" in case.layouts for case in cases)


@pytest.mark.parametrize("tp", TP_SIZES)
def test_batch_sizes_from_empty_to_capacity(tp):
    cases = default_cases(tp)
    sizes = [len(case.slots) for case in cases]
    assert 0 in sizes
    large = [case for case in cases if len(case.slots) >= LARGE_BATCH]
    assert len(large) >= 3, "hundreds of requests in some cases"
    assert any(len(case.slots) == case.max_num_reqs for case in large), "a batch at the capacity"
    assert max(sizes) >= 257
    # Large batches keep the vocabulary small (CPU time).
    assert all(case.vocab_size <= 33 for case in large)


@pytest.mark.parametrize("tp", TP_SIZES)
def test_rows_per_request_up_to_capacity(tp):
    cases = [case for case in default_cases(tp) if case.slots]
    assert max(case.max_num_logits_per_req for case in cases) >= 6
    at_capacity = [case for case in cases if all(n == case.max_num_logits_per_req for n in case.num_logits_per_req)]
    assert any(case.max_num_logits_per_req > 1 for case in at_capacity)
    for case in cases:
        assert len(set(case.slots)) == len(case.slots) and all(0 <= s < case.max_num_reqs for s in case.slots)
        assert all(1 <= n <= case.max_num_logits_per_req for n in case.num_logits_per_req)


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_ranks_that_own_nothing_and_grammar_on_and_off(tp):
    cases = [case for case in default_cases(tp) if case.slots]
    owners = [{slot % tp for slot in case.slots} for case in cases]
    assert any(len(owned) == 1 for owned in owners), "every request on one rank"
    assert any(case.grammar_positions for case in cases) and any(case.grammar_positions is None for case in cases)


@pytest.mark.parametrize("tp", TP_SIZES)
def test_values_at_their_dtype_limits(tp):
    explicit = [case for case in default_cases(tp) if case.local_outputs != "toy"]
    values = {v for case in explicit for v in _explicit_values(case)}
    assert INT64_MAX in values and INT32_MAX in values


def test_the_same_seed_gives_the_same_cases_whatever_the_process_imported(monkeypatch):
    """Hypothesis draws constants it finds in the loaded modules of the code under test; a run's cases must
    not depend on them (a pytest worker has imported other modules than a CLI run when it generates)."""
    from hypothesis.internal.conjecture import providers

    before = [repr(c) for c in generate_cases(2, 12, 5, fill_gaps=False)]
    found = providers.Constants(integers=set(range(0, 70000, 7)), floats={0.123, 1e300, -5.5})
    monkeypatch.setattr(providers, "_get_local_constants", lambda: found)  # as if a module held them
    providers.CONSTANTS_CACHE.cache.clear()
    assert [repr(c) for c in generate_cases(2, 12, 5, fill_gaps=False)] == before
