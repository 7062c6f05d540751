"""Production under the owner rule owner_table (CL-OWNER-TABLE) equals the reference: owners read from
the step's table (batch entries only, stale entries outside [0, tp) elsewhere), a rank owning nothing
because of the table, tables changed between steps of one sharder; its preconditions, checked with the
checks off too; the table is never written."""

from dataclasses import replace

import numpy as np
import pytest
from bundled import VLLM_034_SHARDED_CACHE
from impl_steps import DEVICE, all_ranks, assert_same, assert_traces_equal, mixed, run_case

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.reference import ReferenceSharder
from shardspec.spec.builders import build_input_batch
from shardspec.spec.case import Case, build_case_inputs, case_owners
from shardspec.spec.errors import PreconditionError
from shardspec.spec.profiles import rules_of

SLOTS = [9, 3, 0, 6, 12, 15, 1]
COUNTS = [1, 2, 1, 3, 1, 1, 2]


def _case(case_id: str, tp: int, table: dict | None, **fields) -> Case:
    base = dict(
        case_id=case_id,
        rules=rules_of(VLLM_034_SHARDED_CACHE),
        tp_size=tp,
        slots=SLOTS,
        num_logits_per_req=COUNTS,
        max_num_reqs=16,
        max_num_logits_per_req=4,
        logprobs_dims=(2, 1),
        grammar_positions=[4, 0, 5],
        owner_table=table,
    )
    return Case(**{**base, **fields})


CASES = [
    _case("initial-tp3", 3, None),
    _case("by-position-tp3", 3, {s: i % 3 for i, s in enumerate(SLOTS)}),
    # Neither slot nor position mod tp, with stale entries outside [0, tp) in slots outside the batch.
    _case("mixed-stale-tp4", 4, {9: 3, 3: 3, 0: 1, 6: 0, 12: 2, 15: 3, 1: 1, 2: -1, 7: 11}),
    _case("one-rank-tp4", 4, {s: 2 for s in SLOTS}),
    _case("mixed-tp2", 2, {9: 0, 3: 0, 0: 1, 6: 1, 12: 1, 15: 0, 1: 0}),
    # No one-rank case: the profile builds no sharder for one rank (PRE-TP-SIZE, CL-CONSTRUCTION).
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.case_id)
def test_owner_table_case_matches_reference(case):
    inputs = build_case_inputs(case, DEVICE)
    expected = run_case(case, all_ranks("reference"), inputs)
    assert_traces_equal(case, expected, run_case(case, all_ranks("production"), inputs))
    if case.tp_size > 1:
        assert_traces_equal(case, expected, run_case(case, mixed, inputs))


def test_a_rank_owns_nothing_because_of_the_table():
    assert set(case_owners(CASES[3])) == {2}


def test_tables_changed_between_steps_of_one_sharder_match_the_reference():
    """One sharder per rank and implementation, three tables in turn (as the engine's assign leaves them):
    nothing from an earlier step's table may stay."""
    tables = [{}, {s: i % 3 for i, s in enumerate(SLOTS)}, {s: (i + 1) % 3 for i, s in enumerate(reversed(SLOTS))}]
    sharders = {
        impl: [
            impl(16, 4, comm=LoopbackComm(rank, 3), device=DEVICE, rules=rules_of(VLLM_034_SHARDED_CACHE))
            for rank in range(3)
        ]
        for impl in (ReferenceSharder, ProductionSharder)
    }
    for k, table in enumerate(tables):
        inputs = build_case_inputs(_case(f"step{k}", 3, table), DEVICE)
        for rank in range(3):
            expected = sharders[ReferenceSharder][rank].shard_sampler_inputs(
                inputs.batch, inputs.grammar, **inputs.shard_kwargs
            )
            got = sharders[ProductionSharder][rank].shard_sampler_inputs(
                inputs.batch, inputs.grammar, **inputs.shard_kwargs
            )
            assert_same(expected, got, f"step {k}, rank {rank}")


def _table(**changes) -> np.ndarray:
    table = np.arange(16, dtype=np.int32) % 3
    for slot, owner in changes.items():
        table[int(slot.removeprefix("s"))] = owner
    return table


@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize(
    "table, pid",
    [
        (None, "PRE-OWNER-TABLE"),
        (_table()[:-1], "PRE-OWNER-TABLE"),
        (np.append(_table(), 0), "PRE-OWNER-TABLE"),
        (_table().astype(np.float32), "PRE-OWNER-TABLE"),
        (_table().tolist(), "PRE-OWNER-TABLE"),
        (_table(s12=3), "PRE-OWNER-TABLE-RANGE"),
        (_table(s9=-1), "PRE-OWNER-TABLE-RANGE"),
    ],
)
def test_table_preconditions_are_rejected_with_the_checks_on_or_off(table, pid, check):
    batch = build_input_batch(SLOTS, COUNTS, device=DEVICE, seq_lens_upper_bound=True)
    sharder = ProductionSharder(
        16, 4, comm=LoopbackComm(1, 3), device=DEVICE, rules=rules_of(VLLM_034_SHARDED_CACHE), check_preconditions=check
    )
    with pytest.raises(PreconditionError, match=rf"\[{pid}\].*field owner_table.*rank 1"):
        sharder.shard_sampler_inputs(batch, None, owner_table=table)


def test_unread_entries_are_neither_checked_nor_written():
    table = _table(s2=-7, s4=99)  # slots 2 and 4 are not in the batch
    kept = table.copy()
    batch = build_input_batch(SLOTS, COUNTS, device=DEVICE, seq_lens_upper_bound=True)
    for rank in range(3):
        sharder = ProductionSharder(
            16, 4, comm=LoopbackComm(rank, 3), device=DEVICE, rules=rules_of(VLLM_034_SHARDED_CACHE)
        )
        local = sharder.shard_sampler_inputs(batch, None, owner_table=table).local_batch
        assert local.req_ids == [f"req-{s}" for s in SLOTS if s % 3 == rank]
    assert np.array_equal(table, kept)


def test_a_table_under_another_owner_rule_is_refused():
    batch = build_input_batch(SLOTS, COUNTS, device=DEVICE, seq_lens_upper_bound=True)
    sharder = ProductionSharder(16, 4, comm=LoopbackComm(0, 3), device=DEVICE, rules=rules_of("vllm-0.34"))
    with pytest.raises(TypeError, match="owner_table: an argument of owner rule owner_table"):
        sharder.shard_sampler_inputs(batch, None, owner_table=_table())


def test_checks_off_give_the_same_plan():
    case = replace(CASES[2], case_id="mixed-stale-unchecked")
    inputs = build_case_inputs(case, DEVICE)
    for rank in range(4):
        results = [
            ProductionSharder(
                16,
                4,
                comm=LoopbackComm(rank, 4),
                device=DEVICE,
                rules=rules_of(VLLM_034_SHARDED_CACHE),
                check_preconditions=c,
            ).shard_sampler_inputs(inputs.batch, inputs.grammar, **inputs.shard_kwargs)
            for c in (True, False)
        ]
        assert_same(results[0], results[1], f"rank {rank}")
