"""Defects that show only on a later step of the same sharder instance."""

from __future__ import annotations

from dataclasses import replace

import torch

from shardspec.reference import ReferenceSharder


class PlanCachedByBatchSize(ReferenceSharder):
    """INV-OWNER: reuses the shard step's result of an earlier batch with the same number of requests."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._plans: dict[int, object] = {}

    def shard_sampler_inputs(self, batch, grammar_output=None):
        if batch.num_reqs not in self._plans:
            self._plans[batch.num_reqs] = super().shard_sampler_inputs(batch, grammar_output)
        return self._plans[batch.num_reqs]


class SampledIdsInReusedBuffer(ReferenceSharder):
    """INV-GATHER-RESULT-STABLE: returns sampled_token_ids as a view of one buffer that every gather reuses."""

    def __init__(self, max_num_reqs, max_num_logits_per_req, *args, **kwargs):
        super().__init__(max_num_reqs, max_num_logits_per_req, *args, **kwargs)
        self._sampled = torch.empty(max_num_reqs * max_num_logits_per_req, dtype=torch.int64, device=self.device)

    def gather_sampler_output(self, *args, **kwargs):
        gathered = super().gather_sampler_output(*args, **kwargs)
        ids = gathered.sampled_token_ids
        reused = self._sampled[: ids.numel()].view(ids.shape)
        reused.copy_(ids)
        return replace(gathered, sampled_token_ids=reused)


class GatherReturnsLocalCountsAtTpOne(ReferenceSharder):
    """INV-GATHER-RESULT-OWNED: at tp 1, returns the local sampler output's num_sampled itself (same values)."""

    def gather_sampler_output(self, local_output, *args, **kwargs):
        gathered = super().gather_sampler_output(local_output, *args, **kwargs)
        if self.tp_size == 1 and local_output is not None and local_output.num_sampled is not None:
            return replace(gathered, num_sampled=local_output.num_sampled)
        return gathered
