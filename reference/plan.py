"""The shard plan: a pure function of replicated host inputs.

Every rank computes the same plan from ``idx_mapping_np`` and
``cu_num_logits_np`` (and, under owner rule owner_table, the step's owner table)
without communicating, owners by the profile's owner rule (INV-OWNER). Names
follow the spec's data model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardspec.spec import rule_meanings


@dataclass(frozen=True)
class ShardPlan:
    tp_size: int
    rank: int
    # [N] owner rank of each batch request (INV-OWNER).
    owners: np.ndarray
    # [N] logits rows of each request (n_i).
    num_logits_per_req: np.ndarray
    # [N] batch positions in owner-sorted order: rank 0's requests in batch
    # order, then rank 1's, ... (INV-SORTED-LOGITS-INDICES).
    owner_sorted_reqs: np.ndarray
    # [tp] logits rows owned by each rank (INV-SPLITS).
    num_logits_per_rank: np.ndarray
    # [tp] requests owned by each rank.
    num_reqs_per_rank: np.ndarray
    # [N] batch position -> index among its owner's requests.
    index_within_owner: np.ndarray
    max_num_reqs_per_rank: int
    max_num_logits_per_req: int

    @property
    def local_reqs(self) -> np.ndarray:
        """Batch positions this rank owns, in batch order."""
        return np.flatnonzero(self.owners == self.rank)

    @property
    def gathered_src_indices(self) -> np.ndarray:
        """[N] row of each batch request in the rank-major gathered results."""
        return self.owners * self.max_num_reqs_per_rank + self.index_within_owner

    def logits_rows_of(self, reqs: np.ndarray, cu_num_logits: np.ndarray) -> np.ndarray:
        """Global logits-row indices of the given requests, concatenated in order."""
        rows = [np.arange(cu_num_logits[i], cu_num_logits[i + 1]) for i in reqs]
        return np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64)


# The owner rules (spec/rules.py) the plan implements: every one the spec defines.
OWNER_RULES = tuple(rule_meanings.OWNER)


def build_plan(
    idx_mapping: np.ndarray,
    cu_num_logits: np.ndarray,
    tp_size: int,
    rank: int,
    owner: str = "slot_mod_tp",
    owner_table: np.ndarray | None = None,
    padding: str = "one",
) -> ShardPlan:
    """Rank ``rank``'s plan under owner rule ``owner`` (``owner_table``: the step's table, read under
    owner_table only) and empty_batch_padding ``padding``, whose largest choice it takes (CL-EMPTY-BATCH)."""
    idx_mapping = np.asarray(idx_mapping, dtype=np.int64)
    cu_num_logits = np.asarray(cu_num_logits, dtype=np.int64)
    num_reqs = idx_mapping.shape[0]
    owners = np.asarray(rule_meanings.owners(owner, idx_mapping.tolist(), tp_size, owner_table), dtype=np.int64)
    num_logits_per_req = np.diff(cu_num_logits)
    # A stable sort keeps batch order among requests of one owner.
    owner_sorted_reqs = np.argsort(owners, kind="stable")
    num_reqs_per_rank = np.bincount(owners, minlength=tp_size)
    num_logits_per_rank = np.bincount(owners, weights=num_logits_per_req, minlength=tp_size).astype(np.int64)
    index_within_owner = np.zeros(num_reqs, dtype=np.int64)
    for owner in range(tp_size):
        mine = np.flatnonzero(owners == owner)
        index_within_owner[mine] = np.arange(mine.shape[0])
    # An empty batch still all-gathers one (unread) row per rank, one column
    # wide, so every rank agrees on non-empty collective shapes (CL-EMPTY-BATCH).
    max_num_reqs_per_rank = rule_meanings.reqs_per_rank_choices(padding, num_reqs_per_rank.tolist())[-1]
    max_num_logits_per_req = int(num_logits_per_req.max()) if num_reqs else 1
    return ShardPlan(
        tp_size=tp_size,
        rank=rank,
        owners=owners,
        num_logits_per_req=num_logits_per_req,
        owner_sorted_reqs=owner_sorted_reqs,
        num_logits_per_rank=num_logits_per_rank,
        num_reqs_per_rank=num_reqs_per_rank,
        index_within_owner=index_within_owner,
        max_num_reqs_per_rank=max_num_reqs_per_rank,
        max_num_logits_per_req=max_num_logits_per_req,
    )
