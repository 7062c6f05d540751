"""Defects that show only on a later step of the same sharder instance."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from shardspec.conformance.broken.support import MisreportingSharder
from shardspec.reference import ReferenceSharder


class PlanCachedByBatchSize(ReferenceSharder):
    """INV-OWNER: reuses the shard step's result of an earlier batch with the same number of requests."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._plans: dict[int, object] = {}

    def shard_sampler_inputs(self, batch, grammar_output=None, **kwargs):
        if batch.num_reqs not in self._plans:
            self._plans[batch.num_reqs] = super().shard_sampler_inputs(batch, grammar_output, **kwargs)
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


class StepCachedByRequests(ReferenceSharder):
    """INV-LOCAL-SEQ-LENS: reuses the shard step's result whenever the same requests come back in the same order, so
    a later decode step of them gets the seq_lens of the first (a plan cache keyed by the request ids)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._steps: dict[tuple, object] = {}

    def shard_sampler_inputs(self, batch, grammar_output=None, **kwargs):
        key = tuple(batch.req_ids)
        if key not in self._steps:
            self._steps[key] = super().shard_sampler_inputs(batch, grammar_output, **kwargs)
        return self._steps[key]


class _LocalFieldCached(ReferenceSharder):
    """Keeps the local batch's ``field`` of the first step whose batch has a given ``key`` and hands it out
    on every later step with that key (a cache keyed by less than the field depends on)."""

    field = ""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._kept: dict = {}

    def key(self, batch):
        raise NotImplementedError

    def shard_sampler_inputs(self, batch, grammar_output=None, **kwargs):
        result = super().shard_sampler_inputs(batch, grammar_output, **kwargs)
        local = result.local_batch
        kept = self._kept.setdefault(self.key(batch), getattr(local, self.field))
        return result._replace(local_batch=replace(local, **{self.field: kept}))


class DraftCountsCachedByRequestSet(_LocalFieldCached):
    """INV-LOCAL-DRAFTS: keeps the local draft counts of the first step with a set of requests, so a later step
    of the same requests whose drafts changed gets the counts of the first."""

    field = "num_draft_tokens_per_req"

    def key(self, batch):
        return frozenset(batch.req_ids)


class LocalDraftsCachedByScheduledDrafts(_LocalFieldCached):
    """INV-LOCAL-DRAFTS: keeps the local num_draft_tokens of the first step with the same requests and the same
    scheduled drafts, so a later step of them whose admitted counts differ (the budget binds otherwise) gets
    the first step's count (a plan cache keyed by what the scheduler sent, not by what verification admits)."""

    field = "num_draft_tokens"

    def key(self, batch):
        scheduled = batch.num_draft_tokens_per_req
        return tuple(batch.req_ids), None if scheduled is None else tuple(np.asarray(scheduled).tolist())


class LocalIdxMappingInFirstStepsDtype(MisreportingSharder):
    """INV-LOCAL-IDX-MAPPING: the local idx_mapping keeps the dtype it had on the sharder's first step (a buffer
    allocated then), whatever dtype a later batch's idx_mapping has."""

    _dtype = None

    def corrupt(self, batch, result):
        local = result.local_batch.idx_mapping
        self._dtype = local.dtype if self._dtype is None else self._dtype
        return self.corrupt_local_batch(result, idx_mapping=local.to(self._dtype))
