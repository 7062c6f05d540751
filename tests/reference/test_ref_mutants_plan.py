"""The shard plan as an object: every array's values and dtype, including ranks that own nothing.

The sharder reads only some of the plan and casts what it reads, so the goldens cannot see a plan
array that is too short (ranks above the last owner left out) or of another dtype.
"""

import numpy as np

from shardspec.reference import build_plan


def test_plan_of_a_batch_that_leaves_the_top_ranks_idle():
    # tp 4: slots 4 and 8 belong to rank 0, slot 1 to rank 1; ranks 2 and 3 own nothing.
    plan = build_plan(np.array([4, 1, 8], dtype=np.int32), np.array([0, 2, 3, 6], dtype=np.int32), 4, 1)
    expected = {
        "owners": [0, 1, 0],
        "num_logits_per_req": [2, 1, 3],
        "owner_sorted_reqs": [0, 2, 1],
        "num_logits_per_rank": [5, 1, 0, 0],
        "num_reqs_per_rank": [2, 1, 0, 0],
        "index_within_owner": [0, 0, 1],
        "gathered_src_indices": [0, 2, 1],
        "local_reqs": [1],
    }
    for name, values in expected.items():
        array = getattr(plan, name)
        assert array.dtype == np.int64, f"{name}: {array.dtype}"
        assert array.tolist() == values, f"{name}: {array.tolist()}"
    assert (plan.tp_size, plan.rank, plan.max_num_reqs_per_rank, plan.max_num_logits_per_req) == (4, 1, 2, 3)
