"""Outputs whose dtype does not follow the inputs'. One defect each."""

from __future__ import annotations

from shardspec.reference import ReferenceSharder


class FullVocabAsFloat32(ReferenceSharder):
    """INV-A2A-LAYOUT: returns the full-vocab rows in float32 whatever the logits' dtype (bfloat16, float16)."""

    def all_to_all_logits(self, logits_shard, metadata):
        return super().all_to_all_logits(logits_shard, metadata).float()
