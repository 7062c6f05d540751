"""Defects that show only above some batch size or draft count. One defect each.

Small generated batches never reach them; the targeted cases (and the large
generated batches, or past 512 requests and 4096 vocabulary columns the cases
at the sizes engines deploy) do.
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


# Past these sizes only the cases at the sizes engines deploy reach (conformance/cases/deployment.py): generated
# batches stop at 512 requests, and vocabularies at a few hundred columns.
GATHER_STAGE_ROWS = 512
EXCHANGE_CHUNK_COLUMNS = 4096


class RowsShiftedPast512Requests(ReferenceSharder):
    """INV-GATHER-SAMPLED-IDS: past the 512th request of the batch, each request gets the next one's gathered
    row (sampled ids, counts, NaN sum), the last the first's of them: a gather staged through a 512-row buffer
    whose later passes start one row late."""

    def gather_sampler_output(self, *args, **kwargs):
        out = super().gather_sampler_output(*args, **kwargs)
        num_reqs = out.sampled_token_ids.shape[0]
        if num_reqs <= GATHER_STAGE_ROWS:
            return out
        order = torch.arange(num_reqs, device=out.sampled_token_ids.device)
        order[GATHER_STAGE_ROWS:] = order[GATHER_STAGE_ROWS:].roll(-1)
        return replace(
            out,
            sampled_token_ids=out.sampled_token_ids[order],
            num_sampled=out.num_sampled[order],
            num_rejected=out.num_rejected[order],
            num_nans=None if out.num_nans is None else out.num_nans[order],
        )


class ColumnsShiftedPast4096(ReferenceSharder):
    """INV-A2A-LAYOUT: in full-vocab rows wider than 4096 columns, every column past the 4096th holds the one
    before it (the last wraps around): an exchange staged in 4096-column chunks that lands each later chunk one
    column late."""

    def all_to_all_logits(self, logits_shard, metadata):
        full = super().all_to_all_logits(logits_shard, metadata)
        if full.shape[1] <= EXCHANGE_CHUNK_COLUMNS:
            return full
        shifted = full.clone()
        shifted[:, EXCHANGE_CHUNK_COLUMNS:] = full[:, EXCHANGE_CHUNK_COLUMNS:].roll(1, dims=1)
        return shifted
