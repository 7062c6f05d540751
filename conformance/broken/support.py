"""Building block for broken sharders whose shard result misreports a correct step."""

from __future__ import annotations

from dataclasses import replace

from shardspec.reference import ReferenceSharder
from shardspec.spec.model import GrammarOutput, InputBatch, ShardResult


class MisreportingSharder(ReferenceSharder):
    """Runs the whole step correctly but hands the caller a corrupted shard result.

    The later steps use the true metadata and local batch, so only what the
    caller reads is wrong (subclasses override :meth:`corrupt`).
    """

    def shard_sampler_inputs(self, batch: InputBatch, grammar: GrammarOutput | None, **kwargs) -> ShardResult:
        self._true = super().shard_sampler_inputs(batch, grammar, **kwargs)
        return self.corrupt(batch, self._true)

    def corrupt(self, batch: InputBatch, result: ShardResult) -> ShardResult:
        raise NotImplementedError

    def corrupt_local_batch(self, result: ShardResult, **fields) -> ShardResult:
        return result._replace(local_batch=replace(result.local_batch, **fields))

    def all_to_all_logits(self, logits_shard, metadata):
        return super().all_to_all_logits(logits_shard, self._true.metadata)

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        return super().gather_sampler_output(
            local_output, self._true.metadata, global_batch, self._true.local_batch, **kwargs
        )
