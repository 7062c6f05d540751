"""Defects that show only above some batch size or draft count. One defect each.

Small generated batches never reach them; the targeted cases (and the large
generated batches) do.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from shardspec.conformance.broken.support import MisreportingSharder
from shardspec.reference import ReferenceSharder

BLOCK_REQS = 64
MAX_COLUMNS = 4


class LocalSlotsWrapAt64(MisreportingSharder):
    """INV-LOCAL-IDX-MAPPING: a rank's local slots beyond 64 requests repeat its first ones (a 64-entry block)."""

    def corrupt(self, batch, result):
        slots = result.local_batch.idx_mapping
        if slots.shape[0] <= BLOCK_REQS:
            return result
        wrapped = slots[torch.arange(slots.shape[0], device=slots.device) % BLOCK_REQS]
        return self.corrupt_local_batch(result, idx_mapping=wrapped)


class SampledIdsCappedAtFourColumns(ReferenceSharder):
    """INV-GATHER-SAMPLED-IDS: sampled id columns beyond the fourth (more than three draft tokens) come back as 0."""

    def gather_sampler_output(self, *args, **kwargs):
        gathered = super().gather_sampler_output(*args, **kwargs)
        ids = gathered.sampled_token_ids
        if ids.shape[1] <= MAX_COLUMNS:
            return gathered
        capped = ids.clone()
        capped[:, MAX_COLUMNS:] = 0
        return replace(gathered, sampled_token_ids=capped)


class IdsReversedAboveThreeRequests(ReferenceSharder):
    """INV-GATHER-SAMPLED-IDS: above three requests the sampled ids come back in reverse batch order; at every
    size num_sampled and num_rejected are swapped, so smaller cases fail INV-GATHER-COUNTS without it."""

    def gather_sampler_output(self, *args, **kwargs):
        out = super().gather_sampler_output(*args, **kwargs)
        out = replace(out, num_sampled=out.num_rejected, num_rejected=out.num_sampled)
        if out.sampled_token_ids.shape[0] <= 3:
            return out
        return replace(out, sampled_token_ids=out.sampled_token_ids.flip(0))
