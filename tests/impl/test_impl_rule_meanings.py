"""Production's vectorised rule paths (impl/profiles.py, impl/profile_checks.py) equal the one definition of
each rule value (spec/rule_meanings.py) over a grid of batch sizes, groups, slots and owner tables."""

import itertools

import numpy as np
import pytest

from shardspec.impl import profile_checks, profiles
from shardspec.spec import rule_meanings
from shardspec.spec.rules import RULES_BY_NAME

NUM_REQS = range(0, 11)
TPS = (1, 2, 3, 4, 5, 8)
CAPACITY = 16


def _slots(num_reqs: int, seed: int) -> np.ndarray:
    """Distinct slots in [0, CAPACITY), in a shuffled order: what idx_mapping_np holds."""
    return np.random.default_rng(seed).permutation(CAPACITY)[:num_reqs].astype(np.intp)


def _tables(tp: int):
    """Owner tables of the capacity: the initial one (slot mod tp), every slot on one rank, and random ones."""
    rng = np.random.default_rng(tp)
    yield np.arange(CAPACITY, dtype=np.int32) % tp
    yield np.full(CAPACITY, tp - 1, dtype=np.int32)
    for _ in range(3):
        yield rng.integers(0, tp, CAPACITY).astype(np.int32)


def test_every_owner_value_has_one_definition_and_production_implements_it():
    assert set(rule_meanings.OWNER) == set(RULES_BY_NAME["owner"].values)
    assert set(profiles.OWNER_RULES) == set(rule_meanings.OWNER)
    assert set(rule_meanings.EMPTY_BATCH_PADDING) == set(RULES_BY_NAME["empty_batch_padding"].values)


@pytest.mark.parametrize("owner", ["slot_mod_tp", "position_mod_tp", "contiguous_ranges"])
@pytest.mark.parametrize("tp", TPS)
def test_production_owners_equal_the_definition(owner, tp):
    for num_reqs, seed in itertools.product(NUM_REQS, range(3)):
        slots = _slots(num_reqs, seed)
        expected = rule_meanings.owners(owner, slots.tolist(), tp)
        assert profiles.owners(slots, tp, owner).tolist() == expected, (num_reqs, seed)


@pytest.mark.parametrize("tp", TPS)
def test_production_table_owners_equal_the_definition(tp):
    for num_reqs, seed in itertools.product(NUM_REQS, range(3)):
        slots = _slots(num_reqs, seed)
        for table in _tables(tp):
            expected = rule_meanings.owners("owner_table", slots.tolist(), tp, table)
            assert profile_checks.table_owners(table, slots, CAPACITY, tp, 0).tolist() == expected


@pytest.mark.parametrize("padding", sorted(rule_meanings.EMPTY_BATCH_PADDING))
@pytest.mark.parametrize("tp", TPS)
def test_production_padding_is_a_choice_of_the_definition(padding, tp):
    for num_reqs, seed in itertools.product(NUM_REQS, range(3)):
        owners = profiles.owners(_slots(num_reqs, seed), tp, "slot_mod_tp")
        reqs_per_rank = np.bincount(owners, minlength=tp).tolist()
        choices = rule_meanings.reqs_per_rank_choices(padding, reqs_per_rank)
        # Production pads as the reference does: the definition's largest choice.
        assert profiles.padded_reqs_per_rank(reqs_per_rank, num_reqs) == choices[-1]
