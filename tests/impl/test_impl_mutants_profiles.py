"""impl/profiles.py's host rules piece by piece: the dtypes of the admitted prefix sums, and
seq_lens_cpu_upper_bound cut from a bound that numpy cannot read (another dtype, or not on the CPU),
which only a run with the checks off reaches (PRE-SEQ-LENS-UPPER-BOUND)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from shardspec.impl import profiles
from shardspec.spec.profiles import rules_of

RULES = rules_of("vllm-0.33")  # drafts admitted, the bound the spec's


def _batch(**fields):
    base = dict(
        num_draft_tokens_per_req=np.array([2, 0, 3], dtype=np.int32),
        num_admitted_draft_tokens=np.array([1, 0, 3], dtype=np.int32),
        cu_num_logits_np=np.array([0, 3, 4, 8], dtype=np.int32),
        num_draft_tokens=5,
        seq_lens_cpu_upper_bound=None,
    )
    return SimpleNamespace(**{**base, **fields})


def test_admitted_rows_are_int64_prefix_sums_and_counts():
    cu, counts = profiles.admitted_rows(_batch(), np.array([3, 1, 4], dtype=np.int32))
    assert cu.dtype == np.int64 and counts.dtype == np.int64
    assert cu.tolist() == [0, 2, 3, 7] and counts.tolist() == [2, 1, 4]
    assert profiles.admitted_cu(_batch()).tolist() == [0, 2, 3, 7]


@pytest.mark.parametrize(
    "bound",
    [torch.tensor([7.0, 8.0, 9.0], dtype=torch.float64), torch.tensor([7, 8, 9], dtype=torch.int32, device="meta")],
    ids=["float64", "meta"],
)
def test_a_bound_numpy_cannot_read_is_cut_with_torch(bound):
    num_drafts, local_bound, admitted = profiles.local_profile_fields(
        _batch(seq_lens_cpu_upper_bound=bound), np.array([2, 0]), np.array([3, 2], dtype=np.int32), RULES
    )
    assert num_drafts == 4 and admitted is None  # the admitted drafts of requests 2 and 0
    assert local_bound.device == bound.device and local_bound.dtype == bound.dtype and local_bound.shape == (2,)
    if bound.device.type == "cpu":
        assert local_bound.tolist() == [9.0, 7.0]


def test_a_cpu_integer_bound_is_cut_by_numpy():
    bound = torch.tensor([7, 8, 9], dtype=torch.int32)
    _, local_bound, _ = profiles.local_profile_fields(
        _batch(seq_lens_cpu_upper_bound=bound), np.array([2, 0]), np.array([3, 2], dtype=np.int32), RULES
    )
    assert local_bound.dtype == torch.int32 and local_bound.tolist() == [9, 7]


def test_without_the_rules_that_localize_them_the_fields_stay_the_batch_s():
    bound = torch.tensor([7, 8, 9], dtype=torch.int32)
    batch = _batch(seq_lens_cpu_upper_bound=bound)
    seed = rules_of("vllm-seed")
    num_drafts, local_bound, admitted = profiles.local_profile_fields(
        batch, np.array([2, 0]), np.array([3, 2], dtype=np.int32), seed
    )
    assert num_drafts == 5 and local_bound is bound and admitted is batch.num_admitted_draft_tokens
