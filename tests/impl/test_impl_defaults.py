"""Defaults and the checks kept with the others off, as the data model gives them."""

import numpy as np
import pytest
from test_impl_preconditions import SLOTS, _batch, _build, _output, _shard, _sharder

from shardspec.spec.errors import PreconditionError


def test_nan_counts_are_not_gathered_unless_asked():
    batch = _build(SLOTS, [1, 1, 1, 1, 1])
    sharder = _sharder()
    shard = sharder.shard_sampler_inputs(batch, None)
    gathered = sharder.gather_sampler_output(_output(shard.local_batch), shard.metadata, batch, shard.local_batch)
    assert gathered.num_nans is None


@pytest.mark.parametrize(
    "overrides, capacity, message",
    [
        ({}, {"max_num_reqs": 4}, "[PRE-CAPACITY-REQS]"),
        ({"cu_num_logits_np": np.array([0, 1, 2, 3, 8, 9], np.int32)}, {}, "[PRE-CAPACITY-LOGITS]"),
    ],
    ids=["requests", "logits-rows"],
)
def test_capacity_errors_with_the_checks_off_name_the_rank(overrides, capacity, message):
    with pytest.raises(PreconditionError) as caught:
        _shard(_batch(**overrides), rank=1, check_preconditions=False, **capacity)
    assert str(caught.value).startswith(message) and str(caught.value).endswith("rank 1)"), str(caught.value)
