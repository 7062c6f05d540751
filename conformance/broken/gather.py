"""Broken gathers of sampled ids, counts and NaN sums, and broken wire layouts. One defect each."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from shardspec.reference import ReferenceSharder


class NarrowIdsFilledWithMinusOne(ReferenceSharder):
    """INV-GATHER-SAMPLED-IDS: columns beyond a narrow local width hold -1 instead of 0."""

    def _pack_sampled(self, local_output, metadata, local_batch, gather_num_nans):
        packed = super()._pack_sampled(local_output, metadata, local_batch, gather_num_nans)
        if local_output is not None and metadata.num_local_reqs:
            width = min(local_output.sampled_token_ids.shape[1], metadata.max_num_logits_per_req)
            packed[: metadata.num_local_reqs, width : metadata.max_num_logits_per_req] = -1
        return packed


class CountsSwapped(ReferenceSharder):
    """INV-GATHER-COUNTS: the result's num_sampled and num_rejected are swapped."""

    def gather_sampler_output(self, *args, **kwargs):
        out = super().gather_sampler_output(*args, **kwargs)
        return replace(out, num_sampled=out.num_rejected, num_rejected=out.num_sampled)


class NanSumOfLastRowOnly(ReferenceSharder):
    """INV-GATHER-NANS: a request's NaN count is its last logits row's, not the sum over its rows."""

    def _pack_sampled(self, local_output, metadata, local_batch, gather_num_nans):
        if gather_num_nans and local_output is not None and local_output.num_nans is not None:
            cu = np.asarray(local_batch.cu_num_logits_np, dtype=np.int64)
            keep = torch.zeros_like(local_output.num_nans, dtype=torch.bool)
            keep[torch.from_numpy(cu[1:] - 1).to(keep.device)] = True
            local_output = replace(local_output, num_nans=local_output.num_nans * keep)
        return super()._pack_sampled(local_output, metadata, local_batch, gather_num_nans)


class ResultWidthOfLocalSampler(ReferenceSharder):
    """INV-RANK-AGREEMENT: each rank cuts or pads the gathered ids to its own local sampler width."""

    def gather_sampler_output(self, local_output, *args, **kwargs):
        out = super().gather_sampler_output(local_output, *args, **kwargs)
        width = 1 if local_output is None else local_output.sampled_token_ids.shape[1]
        ids = out.sampled_token_ids
        if width <= ids.shape[1]:
            resized = ids[:, :width].clone()
        else:
            resized = torch.cat([ids, ids.new_zeros(ids.shape[0], width - ids.shape[1])], dim=1)
        return replace(out, sampled_token_ids=resized)


class CountsFirstOnTheWire(ReferenceSharder):
    """INV-WIRE-SAMPLED: the sampled buffer puts num_sampled, num_rejected before the ids (read back alike)."""

    _unpack_width = None  # set between packing the sampled buffer and gathering it

    def _pack_sampled(self, local_output, metadata, local_batch, gather_num_nans):
        packed = super()._pack_sampled(local_output, metadata, local_batch, gather_num_nans)
        self._unpack_width = metadata.max_num_logits_per_req
        return packed[:, _counts_first(self._unpack_width, packed.shape[1])]

    def _all_gather(self, send):
        received = super()._all_gather(send)
        width, self._unpack_width = self._unpack_width, None
        if width is None:
            return received
        return received[:, np.argsort(_counts_first(width, received.shape[1]))]


def _counts_first(width: int, num_cols: int) -> list[int]:
    """Column order with [W, W + 2) moved to the front."""
    return [width, width + 1, *range(width), *range(width + 2, num_cols)]


class NanCountsInOwnGather(ReferenceSharder):
    """INV-WIRE-SEQUENCE: NaN sums travel in a fifth all_gather instead of the sampled buffer's last column."""

    def gather_sampler_output(
        self, local_output, metadata, global_batch, local_batch, *, gather_num_nans=False, logprobs_dims=None
    ):
        out = super().gather_sampler_output(
            local_output, metadata, global_batch, local_batch, gather_num_nans=False, logprobs_dims=logprobs_dims
        )
        if not gather_num_nans:
            return out
        sums = torch.zeros(metadata.max_num_reqs_per_rank, dtype=torch.int64, device=self.device)
        if local_output is not None and metadata.num_local_reqs:
            cu = np.asarray(local_batch.cu_num_logits_np, dtype=np.int64)
            owner = torch.from_numpy(np.repeat(np.arange(cu.shape[0] - 1), np.diff(cu))).to(self.device)
            sums[: metadata.num_local_reqs].index_add_(0, owner, local_output.num_nans.to(torch.int64))
        gathered = self._all_gather(sums)
        return replace(out, num_nans=gathered[metadata.gathered_src_indices].to(torch.int32))


class ScratchInLocalBatch(ReferenceSharder):
    """INV-INPUTS-UNCHANGED: after gathering, uses the local batch's seq_lens as scratch space."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        gathered = super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
        local_batch.seq_lens.zero_()
        return gathered
