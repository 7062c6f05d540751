"""Building blocks for the broken sharders: a plan override and a misreporting shard step."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import numpy as np
import torch

from shardspec.reference import ReferenceSharder, preconditions
from shardspec.reference.plan import ShardPlan, build_plan
from shardspec.reference.sharder import _local_grammar_output
from shardspec.spec.model import BatchShardMetadata, GrammarOutput, InputBatch, ShardResult


class PlannedSharder(ReferenceSharder):
    """The reference shard step driven by a plan that :meth:`plan` may alter."""

    def plan(self, batch: InputBatch) -> ShardPlan:
        return build_plan(batch.idx_mapping_np, np.asarray(batch.cu_num_logits_np, np.int64), self.tp_size, self.rank)

    def shard_sampler_inputs(self, batch: InputBatch, grammar: Optional[GrammarOutput]) -> ShardResult:
        if self.check_preconditions:
            preconditions.check_input_batch(batch, max_num_reqs=self.max_num_reqs,
                                            max_num_logits_per_req=self.max_num_logits_per_req, rank=self.rank)
            preconditions.check_grammar_output(grammar, batch, rank=self.rank)
        cu = np.asarray(batch.cu_num_logits_np, dtype=np.int64)
        plan = self.plan(batch)
        logits_indices = batch.logits_indices.to(self.device, torch.int64)
        sorted_rows = torch.from_numpy(plan.logits_rows_of(plan.owner_sorted_reqs, cu)).to(self.device)
        local_reqs = plan.local_reqs
        metadata = BatchShardMetadata(
            tp_size=self.tp_size,
            num_logits_per_rank=[int(n) for n in plan.num_logits_per_rank],
            num_local_logits=int(plan.num_logits_per_rank[self.rank]),
            num_local_reqs=int(local_reqs.shape[0]),
            max_num_reqs_per_rank=plan.max_num_reqs_per_rank,
            gathered_src_indices=torch.from_numpy(plan.gathered_src_indices.astype(np.int64)).to(self.device),
            max_num_logits_per_req=plan.max_num_logits_per_req,
        )
        return ShardResult(
            self._local_batch(batch, plan, local_reqs, cu, logits_indices),
            logits_indices[sorted_rows],
            _local_grammar_output(grammar, batch, local_reqs, cu),
            metadata,
        )


class MisreportingSharder(ReferenceSharder):
    """Runs the whole step correctly but hands the caller a corrupted shard result.

    The later steps use the true metadata and local batch, so only what the
    caller reads is wrong (subclasses override :meth:`corrupt`).
    """

    def shard_sampler_inputs(self, batch: InputBatch, grammar: Optional[GrammarOutput]) -> ShardResult:
        self._true = super().shard_sampler_inputs(batch, grammar)
        return self.corrupt(batch, self._true)

    def corrupt(self, batch: InputBatch, result: ShardResult) -> ShardResult:
        raise NotImplementedError

    def corrupt_local_batch(self, result: ShardResult, **fields) -> ShardResult:
        return result._replace(local_batch=replace(result.local_batch, **fields))

    def all_to_all_logits(self, logits_shard, metadata):
        return super().all_to_all_logits(logits_shard, self._true.metadata)

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        return super().gather_sampler_output(local_output, self._true.metadata, global_batch,
                                             self._true.local_batch, **kwargs)
