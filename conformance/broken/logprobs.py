"""Broken logprob gathers. One defect each."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from shardspec.conformance.broken.support import LogprobsRewritingSharder
from shardspec.reference import ReferenceSharder
from shardspec.spec.model import LogprobsTensors, num_logprob_columns


def _widened(lp: LogprobsTensors, num_cols: int, pad_logprob: float) -> LogprobsTensors:
    """``lp`` with columns added up to ``num_cols``: token id 0, logprob ``pad_logprob``."""
    missing = num_cols - lp.logprobs.shape[1]
    if missing <= 0:
        return lp
    ids = torch.cat([lp.logprob_token_ids, lp.logprob_token_ids.new_zeros(lp.logprobs.shape[0], missing)], dim=1)
    pad = lp.logprobs.new_full((lp.logprobs.shape[0], missing), pad_logprob)
    return lp._replace(logprob_token_ids=ids, logprobs=torch.cat([lp.logprobs, pad], dim=1))


class LogprobPadZero(ReferenceSharder):
    """INV-LOGPROBS-VALUES: columns beyond a narrow local logprob width hold 0.0 instead of -inf."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        dims = kwargs.get("logprobs_dims")
        if dims is not None and local_output is not None and local_output.logprobs_tensors is not None:
            widened = _widened(local_output.logprobs_tensors, num_logprob_columns(dims), 0.0)
            local_output = replace(local_output, logprobs_tensors=widened)
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)


class LogprobWidthIgnoresTokenIds(ReferenceSharder):
    """INV-LOGPROBS-SHAPES: logprob width 1 + k, ignoring max_token_ids (should be 1 + max(k, t))."""

    def gather_sampler_output(
        self, local_output, metadata, global_batch, local_batch, *, gather_num_nans=False, logprobs_dims=None
    ):
        dims = None if logprobs_dims is None else (logprobs_dims[0], 0)
        return super().gather_sampler_output(
            local_output, metadata, global_batch, local_batch, gather_num_nans=gather_num_nans, logprobs_dims=dims
        )


class MissingLogprobsAsZeros(ReferenceSharder):
    """INV-LOGPROBS-MISSING: a rank without logprobs sends logprob 0.0 rows instead of -inf."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        dims = kwargs.get("logprobs_dims")
        if dims is not None and local_output is not None and local_output.logprobs_tensors is None:
            rows, cols = local_batch.num_logits, num_logprob_columns(dims)
            zeros = LogprobsTensors(
                torch.zeros(rows, cols, dtype=torch.int64, device=self.device),
                torch.zeros(rows, cols, dtype=torch.float32, device=self.device),
                torch.zeros(rows, dtype=torch.int64, device=self.device),
                None,
            )
            local_output = replace(local_output, logprobs_tensors=zeros)
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)


class SelectedRanksDropped(LogprobsRewritingSharder):
    """INV-LOGPROBS-VALUES: selected_token_ranks are not gathered; every entry is 0."""

    def rewrite_logprobs(self, lp, global_batch):
        return lp._replace(selected_token_ranks=torch.zeros_like(lp.selected_token_ranks))


class CuNumGeneratedAlwaysList(LogprobsRewritingSharder):
    """INV-CU-NUM-GENERATED: cu_num_generated_tokens is a list even with one row per request (L == N)."""

    def rewrite_logprobs(self, lp, global_batch):
        return lp._replace(cu_num_generated_tokens=[int(c) for c in np.asarray(global_batch.cu_num_logits_np)])


class LogprobValuesAsFloat64(ReferenceSharder):
    """INV-WIRE-LOGPROBS: logprob values travel as float64 instead of float32 (converted back after)."""

    def _all_gather(self, send):
        if send.dtype != torch.float32:
            return super()._all_gather(send)
        return super()._all_gather(send.to(torch.float64)).to(torch.float32)
