"""Broken owners under the owner rule owner_table (CL-OWNER-TABLE): the table ignored, kept from the first
step, written by the sharder, read beyond the batch's entries (its stale entries deciding the padding), or
compared across the ranks through a collective (CL-OWNER-TABLE-AGREEMENT)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from shardspec.reference import ReferenceSharder
from shardspec.reference.plan import build_plan
from shardspec.reference.profile_rules import device_cu_num_logits


class OwnerByPositionIgnoringTable(ReferenceSharder):
    """INV-OWNER: owns by batch position mod tp (vllm-0.34 without a sharded cache) and ignores the step's table."""

    def plan(self, batch, owner_table=None):
        cu = device_cu_num_logits(batch, self.profile)
        return build_plan(batch.idx_mapping_np, cu, self.tp_size, self.rank, "position_mod_tp")


class OwnersOfFirstTable(ReferenceSharder):
    """INV-OWNER: copies the owner table of its first step and reads that copy every later step (the owners it
    cached then), so a step after the engine rewrote the table gets stale owners; a single step is right."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._first_table = None

    def shard_sampler_inputs(self, batch, grammar, *, owner_table=None):
        if self._first_table is None and owner_table is not None:
            self._first_table = np.array(owner_table, copy=True)
        kept = owner_table if self._first_table is None else self._first_table
        return super().shard_sampler_inputs(batch, grammar, owner_table=kept)


class AssignsTheTable(ReferenceSharder):
    """INV-INPUTS-UNCHANGED: rewrites the batch's entries of the owner table to their positions mod tp after
    sharding, the engine's assign after verification, done by the sharder on the engine's table."""

    def shard_sampler_inputs(self, batch, grammar, *, owner_table=None):
        result = super().shard_sampler_inputs(batch, grammar, owner_table=owner_table)
        slots = np.asarray(batch.idx_mapping_np, dtype=np.intp)
        owner_table[slots] = np.arange(slots.shape[0]) % self.tp_size
        return result


class PaddingFromWholeTable(ReferenceSharder):
    """INV-META-SCALARS: pads the all-gathers to the most entries any rank has in the whole owner table, not to
    the most requests it owns in the batch: entries of slots outside the batch decide max_num_reqs_per_rank."""

    def plan(self, batch, owner_table=None):
        plan = super().plan(batch, owner_table)
        if owner_table is None or batch.num_reqs == 0:
            return plan
        table = np.asarray(owner_table)
        in_range = table[(table >= 0) & (table < self.tp_size)]
        return replace(plan, max_num_reqs_per_rank=int(np.bincount(in_range, minlength=self.tp_size).max()))


class OwnerTablesComparedOnTheWire(ReferenceSharder):
    """INV-WIRE-SEQUENCE: makes sure every rank was given the same owners (CL-OWNER-TABLE-AGREEMENT) by
    all-gathering the batch's entries of its owner table through the Communicator after planning, and raises
    where they differ: a collective the wire sequence does not have, where every rank must derive the plan
    from its own copy without talking to the others."""

    def shard_sampler_inputs(self, batch, grammar, *, owner_table=None):
        result = super().shard_sampler_inputs(batch, grammar, owner_table=owner_table)  # the preconditions first
        if owner_table is not None and batch.num_reqs:
            slots = np.asarray(batch.idx_mapping_np, dtype=np.intp)
            mine = torch.as_tensor(np.asarray(owner_table)[slots].astype(np.int64), device=self.device)
            every = mine.new_empty(self.tp_size * mine.numel())
            self.comm.all_gather_into_tensor(every, mine)
            if not bool((every.view(self.tp_size, -1) == mine).all()):
                raise RuntimeError(f"rank {self.rank}: the ranks were given different owner tables")
        return result
