"""The plan's owner rules (INV-OWNER): by slot, by batch position, by the step's owner table, by contiguous
ranges of positions, and an unknown rule it refuses."""

import numpy as np
import pytest
import torch

from shardspec.comm import LoopbackComm
from shardspec.reference import ReferenceSharder
from shardspec.reference.plan import OWNER_RULES, build_plan
from shardspec.spec.builders import build_input_batch
from shardspec.spec.errors import PreconditionError
from shardspec.spec.profiles import rules_of
from shardspec.spec.rule_meanings import owners
from shardspec.spec.rules import RULES_BY_NAME, Rules

SLOTS = np.array([9, 3, 0, 6, 12, 15, 1])
CU = np.array([0, 1, 3, 4, 7, 8, 9, 11])


def test_owners_by_slot_and_by_position():
    assert owners("slot_mod_tp", SLOTS, 3) == [0, 0, 0, 0, 0, 0, 1]
    assert owners("position_mod_tp", SLOTS, 3) == [0, 1, 2, 0, 1, 2, 0]
    assert build_plan(SLOTS, CU, 3, 0).owners.tolist() == (SLOTS % 3).tolist()  # the default is the slot


def test_the_position_plan_balances_and_keeps_batch_order():
    plan = build_plan(SLOTS, CU, 3, 1, "position_mod_tp")
    assert plan.local_reqs.tolist() == [1, 4]
    assert plan.num_reqs_per_rank.tolist() == [3, 2, 2] and plan.max_num_reqs_per_rank == 3
    assert plan.num_logits_per_rank.tolist() == [1 + 3 + 2, 2 + 1, 1 + 1]
    assert plan.owner_sorted_reqs.tolist() == [0, 3, 6, 1, 4, 2, 5]
    assert plan.gathered_src_indices.tolist() == [0, 3, 6, 1, 4, 7, 2]


def test_the_plan_implements_every_declared_owner_rule_and_refuses_others():
    assert set(OWNER_RULES) == set(RULES_BY_NAME["owner"].values)
    with pytest.raises(NotImplementedError, match="owner rule slot_div_tp: not supported yet"):
        owners("slot_div_tp", SLOTS, 3)
    rules = Rules.of("engine", {**rules_of("vllm-0.33").as_dict(), "owner": "slot_div_tp"})
    with pytest.raises(NotImplementedError, match="owner rule slot_div_tp: not supported yet"):
        rules.owners([9], 3)


@pytest.mark.parametrize("num_reqs", range(0, 12))
@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8])
def test_contiguous_ranges_are_balanced_and_in_rank_order(num_reqs, tp):
    slots = np.arange(num_reqs)[::-1].copy()
    ranged = np.asarray(owners("contiguous_ranges", slots, tp), dtype=np.int64)
    counts = np.bincount(ranged, minlength=tp)
    assert ranged.tolist() == sorted(ranged.tolist())  # contiguous, in rank order
    assert counts.tolist() == [num_reqs // tp + (r < num_reqs % tp) for r in range(tp)]
    rules = Rules.of("engine", {**rules_of("vllm-0.34").as_dict(), "owner": "contiguous_ranges"})
    assert rules.owners(slots, tp) == ranged.tolist()
    assert build_plan(slots, np.arange(num_reqs + 1), tp, 0, "contiguous_ranges").owners.tolist() == ranged.tolist()


def test_the_contiguous_plan_keeps_batch_order():
    plan = build_plan(SLOTS, CU, 3, 1, "contiguous_ranges")
    assert plan.owners.tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert plan.owner_sorted_reqs.tolist() == list(range(7)) and plan.local_reqs.tolist() == [3, 4]
    assert plan.gathered_src_indices.tolist() == [0, 1, 2, 3, 4, 6, 7] and plan.max_num_reqs_per_rank == 3


# Slots 0..15, tp 3: an owner table an engine may hold (entries of slots outside SLOTS hold stale values,
# some outside [0, 3): they are never read).
TABLE = np.array([2, 1, 9, 0, 5, -1, 1, 7, 8, 2, 4, 4, 0, 1, 1, 2], dtype=np.int32)
TABLE_PROFILE = "vllm-0.34-sharded-draft-cache"


def test_owners_by_the_table_read_the_batch_entries_only():
    by_table = owners("owner_table", SLOTS, 3, TABLE)
    assert by_table == [2, 0, 2, 1, 0, 2, 1]
    assert rules_of(TABLE_PROFILE).owners(SLOTS, 3, TABLE) == by_table
    plan = build_plan(SLOTS, CU, 3, 0, "owner_table", TABLE)
    # Batch order kept within an owner; rank 0 owns positions 1 and 4.
    assert plan.local_reqs.tolist() == [1, 4]
    assert plan.owner_sorted_reqs.tolist() == [1, 4, 3, 6, 0, 2, 5]
    assert plan.gathered_src_indices.tolist() == [6, 0, 7, 3, 1, 8, 4]
    with pytest.raises(ValueError, match="the owner table is needed"):
        owners("owner_table", SLOTS, 3)


def test_a_rank_may_own_nothing_because_of_the_table():
    table = np.zeros(16, dtype=np.int32)
    plan = build_plan(SLOTS, CU, 3, 2, "owner_table", table)
    assert plan.local_reqs.tolist() == [] and plan.num_reqs_per_rank.tolist() == [7, 0, 0]
    assert plan.max_num_reqs_per_rank == 7


def _shard(table, tp=3, rank=0, **kwargs):
    batch = build_input_batch(SLOTS.tolist(), np.diff(CU).tolist(), seq_lens_upper_bound=True)
    sharder = ReferenceSharder(16, 4, comm=LoopbackComm(rank, tp), rules=rules_of(TABLE_PROFILE), **kwargs)
    return sharder.shard_sampler_inputs(batch, None, owner_table=table)


def test_the_reference_neither_writes_nor_checks_unread_entries():
    table = TABLE.copy()
    shard = _shard(table)
    assert shard.local_batch.req_ids == [f"req-{SLOTS[1]}", f"req-{SLOTS[4]}"]
    assert np.array_equal(table, TABLE)


@pytest.mark.parametrize(
    "table, pid",
    [
        (None, "PRE-OWNER-TABLE"),
        (TABLE[:-1], "PRE-OWNER-TABLE"),
        (np.append(TABLE, 0), "PRE-OWNER-TABLE"),
        (TABLE.astype(np.float64), "PRE-OWNER-TABLE"),
        (torch.from_numpy(TABLE), "PRE-OWNER-TABLE"),
        (np.where(np.arange(16) == 9, 3, TABLE).astype(np.int32), "PRE-OWNER-TABLE-RANGE"),
        (np.where(np.arange(16) == 15, -1, TABLE).astype(np.int32), "PRE-OWNER-TABLE-RANGE"),
    ],
)
def test_the_table_preconditions_are_rejected(table, pid):
    with pytest.raises(PreconditionError, match=rf"\[{pid}\].*field owner_table"):
        _shard(table)


def test_a_table_under_another_owner_rule_is_refused():
    batch = build_input_batch(SLOTS.tolist(), np.diff(CU).tolist(), seq_lens_upper_bound=True)
    sharder = ReferenceSharder(16, 4, comm=LoopbackComm(0, 3), rules=rules_of("vllm-0.34"))
    with pytest.raises(TypeError, match="owner_table: an argument of owner rule owner_table"):
        sharder.shard_sampler_inputs(batch, None, owner_table=TABLE)
