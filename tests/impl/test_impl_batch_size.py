"""PRE-BATCH-SIZE: num_reqs, req_ids and idx_mapping_np must agree; each disagreement alone is rejected."""

import numpy as np
import pytest
from test_impl_preconditions import SLOTS, _batch, _shard

from shardspec.spec.errors import PreconditionError


@pytest.mark.parametrize(
    "overrides, seen",
    [
        ({"req_ids": [f"req-{i}" for i in range(len(SLOTS) + 1)]}, "6 req_ids and idx_mapping_np of shape (5,)"),
        ({"idx_mapping_np": np.asarray(SLOTS[:-1], dtype=np.int32)}, "5 req_ids and idx_mapping_np of shape (4,)"),
    ],
    ids=["req-ids", "idx-mapping-np"],
)
def test_one_field_out_of_step_is_rejected(overrides, seen):
    with pytest.raises(PreconditionError) as caught:
        _shard(_batch(**overrides))
    assert caught.value.precondition_id == "PRE-BATCH-SIZE"
    assert f"num_reqs=5 but {seen}" in str(caught.value)
