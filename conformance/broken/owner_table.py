"""Broken owners under the owner rule owner_table (CL-OWNER-TABLE): the table ignored, kept from the first
step, written by the sharder, read beyond the batch's entries (its stale entries deciding the padding),
compared across the ranks through a collective (CL-OWNER-TABLE-AGREEMENT), or predicted from the step before
in one of the forms the engine carries it in (conformance/cases/owner_tables.py, CARRIED)."""

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
        cu = device_cu_num_logits(batch, self.rules)
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


class _PredictsTheRewrite(ReferenceSharder):
    """Keeps the previous step's table and slots, and where :meth:`predicted` gives a table of its own, reads that
    instead of the step's: the engine's rewrite (CL-OWNER-TABLE) done or undone in the sharder's head."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._before = None  # (table, slots) of the step before

    def shard_sampler_inputs(self, batch, grammar, *, owner_table=None):
        read = owner_table
        if owner_table is not None and self._before is not None:
            guess = self.predicted(np.asarray(owner_table), *self._before)
            read = owner_table if guess is None else guess.astype(np.asarray(owner_table).dtype)
        result = super().shard_sampler_inputs(batch, grammar, owner_table=read)
        if owner_table is not None:
            self._before = (np.array(owner_table, copy=True), np.asarray(batch.idx_mapping_np, dtype=np.intp).copy())
        return result

    def rewrite(self, table: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """``table`` with the entries of ``slots`` rewritten to their positions mod tp (the engine's assign)."""
        out = np.array(table, copy=True)
        out[slots] = np.arange(slots.shape[0]) % self.tp_size
        return out

    def predicted(self, table, before, slots):
        raise NotImplementedError


class RewriteTakenForAFreshTable(_PredictsTheRewrite):
    """INV-OWNER: where the step's table is the previous one fully rewritten (the engine's assign), it is taken for
    a fresh table holding only that rewrite: a request that was not in the step before gets slot mod tp, not
    its entry."""

    def predicted(self, table, before, slots):
        if not np.array_equal(table, self.rewrite(before, slots)):
            return None
        return self.rewrite(np.arange(table.shape[0]) % self.tp_size, slots)


class ChangedTableTakenForAFullRewrite(_PredictsTheRewrite):
    """INV-OWNER: a table that changed since the step before is taken to be the engine's full rewrite of it (every
    request of that step verified), and the sharder's own rewrite of the previous table is read: wrong where the
    engine rewrote only some of the entries."""

    def predicted(self, table, before, slots):
        return None if np.array_equal(table, before) else self.rewrite(before, slots)


class UnchangedTableRewrittenBySharder(_PredictsTheRewrite):
    """INV-OWNER: a table identical to the step before's is taken for a copy the engine has not refreshed yet, and
    the rewrite it owes (every request of that step to its position mod tp) is read instead: wrong where the
    engine left the table as it was across the step."""

    def predicted(self, table, before, slots):
        return self.rewrite(before, slots) if np.array_equal(table, before) else None
