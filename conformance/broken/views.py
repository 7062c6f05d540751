"""Inputs read as if they were contiguous tensors of their own. One defect each.

The spec lets every input be a view (``t[::2]`` of an interleaved buffer, a
slice that starts past its storage's first element); implementations must
read them by their strides and storage offset. These read them the way a
kernel handed only a data pointer does.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from numpy.lib.stride_tricks import as_strided

from shardspec.conformance.broken.support import MisreportingSharder
from shardspec.reference import ReferenceSharder


class SeqLensReadWithUnitStride(ReferenceSharder):
    """INV-LOCAL-SEQ-LENS: reads batch.seq_lens as if contiguous: torch.as_strided(t, t.shape, (1,))."""

    def shard_sampler_inputs(self, batch, grammar, **kwargs):
        seq_lens = batch.seq_lens
        misread = torch.as_strided(seq_lens, seq_lens.shape, (1,))
        return super().shard_sampler_inputs(replace(batch, seq_lens=misread), grammar, **kwargs)


class LogitsShardFromStorageStart(ReferenceSharder):
    """INV-A2A-SPLITS: sends the logits shard read from the start of its storage, ignoring the view's storage offset."""

    def all_to_all_logits(self, logits_shard, metadata):
        misread = logits_shard.new_empty(0).set_(
            logits_shard.untyped_storage(), 0, logits_shard.shape, logits_shard.stride()
        )
        return super().all_to_all_logits(misread, metadata)


class LocalCountsReadWithUnitStride(ReferenceSharder):
    """INV-WIRE-SAMPLED: reads the local sampler's num_sampled as if contiguous: torch.as_strided(t, t.shape, (1,))."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        if local_output is not None:
            counts = local_output.num_sampled
            local_output = replace(local_output, num_sampled=torch.as_strided(counts, counts.shape, (1,)))
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)


class UpperBoundReadWithUnitStride(ReferenceSharder):
    """INV-LOCAL-SEQ-LENS-UPPER-BOUND: reads vllm-0.33's seq_lens_cpu_upper_bound as if contiguous.

    torch.as_strided(t, t.shape, (1,))."""

    def shard_sampler_inputs(self, batch, grammar, **kwargs):
        bound = batch.seq_lens_cpu_upper_bound
        if bound is not None:
            batch = replace(batch, seq_lens_cpu_upper_bound=torch.as_strided(bound, bound.shape, (1,)))
        return super().shard_sampler_inputs(batch, grammar, **kwargs)


class AdmittedDraftsFromBufferStart(MisreportingSharder):
    """INV-LOCAL-DRAFTS: the local num_draft_tokens sums num_admitted_draft_tokens read from its buffer's start.

    vllm-0.33's admitted counts read with unit strides from the first element of the buffer the array
    views (as a kernel handed that buffer's address would), clamped to each request's scheduled drafts;
    the plan itself reads them right."""

    def corrupt(self, batch, result):
        admitted = batch.num_admitted_draft_tokens
        local = result.local_batch
        if admitted is None or not local.req_ids:
            return result
        base = admitted.base
        buffer = base if isinstance(base, np.ndarray) and base.dtype == admitted.dtype and base.ndim == 1 else admitted
        misread = as_strided(buffer, shape=admitted.shape, strides=(admitted.itemsize,))
        misread = np.minimum(misread, batch.num_draft_tokens_per_req)
        owned = [batch.req_ids.index(req_id) for req_id in local.req_ids]
        return self.corrupt_local_batch(result, num_draft_tokens=int(misread[owned].sum()))


def _rows_as_if_packed(tensor):
    """A 2-D tensor read as a kernel that checks only the last dimension's stride reads it: with unit
    strides along its rows it is taken to have packed rows (each row right after the one before)."""
    if tensor is None or tensor.dim() != 2 or tensor.stride(-1) != 1:
        return tensor if tensor is None or tensor.dim() != 2 else tensor.contiguous()
    return torch.as_strided(tensor, tensor.shape, (tensor.shape[1], 1))


class LogitsRowsAssumedPacked(ReferenceSharder):
    """INV-A2A-SPLITS: sends the logits shard's rows as if packed wherever its rows have unit stride."""

    def all_to_all_logits(self, logits_shard, metadata):
        return super().all_to_all_logits(_rows_as_if_packed(logits_shard), metadata)


class GrammarBitmaskRowsAssumedPacked(ReferenceSharder):
    """INV-LOCAL-GRAMMAR: reads the grammar bitmask's rows as if packed wherever its rows have unit stride."""

    def shard_sampler_inputs(self, batch, grammar, **kwargs):
        if grammar is not None:
            grammar = replace(grammar, grammar_bitmask=_rows_as_if_packed(grammar.grammar_bitmask))
        return super().shard_sampler_inputs(batch, grammar, **kwargs)


class LocalLogprobsRowsAssumedPacked(ReferenceSharder):
    """INV-WIRE-LOGPROBS: gathers the local logprobs with rows read as if packed wherever they have unit stride."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        lp = None if local_output is None else local_output.logprobs_tensors
        if lp is not None:
            lp = lp._replace(logprobs=_rows_as_if_packed(lp.logprobs))
            local_output = replace(local_output, logprobs_tensors=lp)
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
