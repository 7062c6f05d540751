"""Defects that show only on a later step of the same sharder instance."""

from __future__ import annotations

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
