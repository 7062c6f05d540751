"""Deliberately broken implementations, to test how the suite reports them.

Each misbehaves only for batches of exactly ``TRIGGER_REQS`` requests, so a
run of several cases shows that one bad case does not spoil the others.
"""

from __future__ import annotations

import ctypes
import time

from shardspec.reference import ReferenceSharder

TRIGGER_REQS = 3


class _Base(ReferenceSharder):
    def __init__(self, max_num_reqs, max_num_logits_per_req, *, comm, device):
        super().__init__(max_num_reqs, max_num_logits_per_req, comm=comm, device=device)

    def _triggered(self, global_batch) -> bool:
        return global_batch.num_reqs == TRIGGER_REQS and self.rank == 1


class RaisingSharder(_Base):
    """Rank 1 raises in gather, before its all-gather."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        if self._triggered(global_batch):
            raise RuntimeError("deliberate failure on rank 1")
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)


class HangingSharder(_Base):
    """Rank 1 never returns from gather."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        if self._triggered(global_batch):
            while True:
                time.sleep(1)
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)


class WrongCountsSharder(_Base):
    """Every rank reports num_rejected + 1 for batches of more than two requests."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        out = super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
        if global_batch.num_reqs > 2:
            out.num_rejected = out.num_rejected + 1
        return out


class MismatchedGatherOnRank1(_Base):
    """Rank 1 pads the all-gather to one request more than its peers: the collective's sizes disagree."""

    def shard_sampler_inputs(self, batch, grammar_output=None):
        result = super().shard_sampler_inputs(batch, grammar_output)
        if batch.num_reqs == 3 and self.rank == 1:
            result.metadata.max_num_reqs_per_rank += 1
        return result


class WrongIdsThenCrashWhenSmall(_Base):
    """Reverses the sampled ids of batches of 3+ requests and dies on smaller ones: shrinking the failure
    meets the crash, which must not take the run down with it. (Not in hostile_sharders, whose import empties
    the checkers of the shrinking process: a replay there fails nothing, and the shrink stops before it.)"""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        if global_batch.num_reqs < 3:
            ctypes.string_at(0)
        out = super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
        out.sampled_token_ids = out.sampled_token_ids.flip(0)
        return out


class RaisingConstructor(_Base):
    """Every rank's constructor raises, for every case: the sharder cannot be built."""

    def __init__(self, max_num_reqs, max_num_logits_per_req, *, comm, device):
        raise RuntimeError("deliberate failure in the constructor")


class _Unprintable(RuntimeError):
    def __str__(self):
        raise ValueError("no message for you")


class RaisesUnprintableInGather(_Base):
    """Rank 1 raises an exception whose __str__ raises."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        if self._triggered(global_batch):
            raise _Unprintable()
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)


class RaisesHugeMessageInGather(_Base):
    """Rank 1 raises with a 20 MB message."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        if self._triggered(global_batch):
            raise RuntimeError("x" * (20 << 20))
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)


class _SpoilsNumNans(_Base):
    def spoil(self, tensor):
        raise NotImplementedError

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        gathered = super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
        if self._triggered(global_batch):
            gathered.num_nans = self.spoil(gathered.num_nans)
        return gathered


class MetaTensorInResult(_SpoilsNumNans):
    """Rank 1 returns a meta tensor (no data) as num_nans."""

    def spoil(self, tensor):
        return tensor.to("meta")


class SparseTensorInResult(_SpoilsNumNans):
    """Rank 1 returns a sparse tensor as num_nans."""

    def spoil(self, tensor):
        return tensor.to_sparse()
