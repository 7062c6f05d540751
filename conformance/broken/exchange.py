"""Broken logits exchanges. One defect each."""

from __future__ import annotations

import torch

from shardspec.reference import ReferenceSharder


class VocabBlocksReversed(ReferenceSharder):
    """INV-A2A-LAYOUT: full-vocab rows place the column blocks in reverse rank order."""

    def all_to_all_logits(self, logits_shard, metadata):
        full = super().all_to_all_logits(logits_shard, metadata)
        tp = metadata.tp_size
        return full.view(full.shape[0], tp, -1).flip(1).reshape(full.shape[0], -1)


class ResultInColumnMajorOrder(ReferenceSharder):
    """INV-A2A-LAYOUT: returns the right values as a column-major view (strides (1, L_local)), as a
    vocab-major wire would; a sampler that steps through rows by stride(0) reads other rows."""

    def all_to_all_logits(self, logits_shard, metadata):
        full = super().all_to_all_logits(logits_shard, metadata)
        return full.t().contiguous().t()


class ExchangeInTwoHalves(ReferenceSharder):
    """INV-A2A-SPLITS: the vocab shard travels in two all_to_all_single calls (column halves)."""

    def all_to_all_logits(self, logits_shard, metadata):
        half = logits_shard.shape[1] // 2
        parts = [
            super(ExchangeInTwoHalves, self).all_to_all_logits(part, metadata)
            for part in (logits_shard[:, :half], logits_shard[:, half:])
        ]
        rows, tp = parts[0].shape[0], metadata.tp_size
        blocks = [part.view(rows, tp, -1) for part in parts]
        return torch.cat(blocks, dim=2).reshape(rows, -1)


class SanitizesLogitsInPlace(ReferenceSharder):
    """INV-INPUTS-UNCHANGED: replaces NaNs of the caller's logits shard in place before sending."""

    def all_to_all_logits(self, logits_shard, metadata):
        logits_shard.nan_to_num_(nan=float("-inf"))
        return super().all_to_all_logits(logits_shard, metadata)
