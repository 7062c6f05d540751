"""The plan's owner rules (INV-OWNER): by slot, by batch position, and a declared rule it refuses."""

import numpy as np
import pytest

from shardspec.reference.plan import OWNER_RULES, build_plan, owners_of
from shardspec.spec.profiles import rules_of
from shardspec.spec.rules import RULES_BY_NAME, Rules

SLOTS = np.array([9, 3, 0, 6, 12, 15, 1])
CU = np.array([0, 1, 3, 4, 7, 8, 9, 11])


def test_owners_by_slot_and_by_position():
    assert owners_of(SLOTS, 3, "slot_mod_tp").tolist() == [0, 0, 0, 0, 0, 0, 1]
    assert owners_of(SLOTS, 3, "position_mod_tp").tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert owners_of(SLOTS, 3).tolist() == (SLOTS % 3).tolist()  # the default is the slot


def test_the_position_plan_balances_and_keeps_batch_order():
    plan = build_plan(SLOTS, CU, 3, 1, "position_mod_tp")
    assert plan.local_reqs.tolist() == [1, 4]
    assert plan.num_reqs_per_rank.tolist() == [3, 2, 2] and plan.max_num_reqs_per_rank == 3
    assert plan.num_logits_per_rank.tolist() == [1 + 3 + 2, 2 + 1, 1 + 1]
    assert plan.owner_sorted_reqs.tolist() == [0, 3, 6, 1, 4, 2, 5]
    assert plan.gathered_src_indices.tolist() == [0, 3, 6, 1, 4, 7, 2]


@pytest.mark.parametrize("rule", sorted(set(RULES_BY_NAME["owner"].values) - set(OWNER_RULES)))
def test_a_declared_rule_the_plan_lacks_is_refused(rule):
    with pytest.raises(NotImplementedError, match=f"owner rule {rule}: not supported yet"):
        owners_of(SLOTS, 3, rule)
    rules = Rules.of("engine", {**rules_of("vllm-0.33").as_dict(), "owner": rule})
    with pytest.raises(NotImplementedError, match=f"owner rule {rule}: not supported yet"):
        rules.owner_of(0, 9, 3)
