"""Building blocks of broken sharders: a shard result that misreports a correct step, a step that checks no
precondition, gathered logprobs rewritten."""

from __future__ import annotations

import contextlib
from dataclasses import replace

from shardspec.reference import ReferenceSharder
from shardspec.spec.model import GrammarOutput, InputBatch, LogprobsTensors, ShardResult


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


@contextlib.contextmanager
def preconditions_unchecked(sharder: ReferenceSharder):
    """``sharder`` checks no precondition inside the block: it processes what it would reject."""
    sharder.check_preconditions = False
    try:
        yield
    finally:
        sharder.check_preconditions = True


class LogprobsRewritingSharder(ReferenceSharder):
    """Gathers correctly, then hands back the gathered logprobs as :meth:`rewrite_logprobs` makes them (a step
    without logprobs is left as it is)."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        out = super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
        if out.logprobs_tensors is None:
            return out
        return replace(out, logprobs_tensors=self.rewrite_logprobs(out.logprobs_tensors, global_batch))

    def rewrite_logprobs(self, logprobs: LogprobsTensors, global_batch: InputBatch) -> LogprobsTensors:
        raise NotImplementedError


class EmptyBatchPaddedTo(ReferenceSharder):
    """Plans an empty batch with :attr:`reqs_per_rank` as its max_num_reqs_per_rank, a value of its own."""

    reqs_per_rank: int

    def plan(self, batch, owner_table=None):
        plan = super().plan(batch, owner_table)
        return replace(plan, max_num_reqs_per_rank=self.reqs_per_rank) if batch.num_reqs == 0 else plan
