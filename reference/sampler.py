"""A deterministic toy sampler and the replicated (unsharded) path.

End-to-end transparency (INV-E2E-TRANSPARENCY) is stated against a
deterministic sampler: greedy argmax after the grammar mask, and a toy
rejection rule that accepts leading draft positions whose greedy token is even.
The same function samples one rank's local batch in the sharded path and the
whole batch in the replicated path.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from shardspec.spec.model import (
    GrammarOutput,
    InputBatch,
    LogprobsTensors,
    SamplerOutput,
    admitted_cu_num_logits,
    num_logprob_columns,
)
from shardspec.spec.profiles import default_rules
from shardspec.spec.rules import Rules

PLACEHOLDER_TOKEN_ID = -1  # rejected positions of the toy rejection sampler


def apply_grammar_bitmask(
    logits: torch.Tensor, batch: InputBatch, grammar: GrammarOutput | None, rules: Rules | None = None
) -> torch.Tensor:
    """Mask to -inf every token whose bit is clear, for the listed requests' rows.

    vllm-seed: one bitmask row per logits row; vllm-0.33: a block of S rows per listed request, whose
    row p masks the request's p-th logits row (CL-GRAMMAR-BLOCKS).
    """
    if grammar is None or not grammar.structured_output_request_ids:
        return logits
    position = {req_id: i for i, req_id in enumerate(batch.req_ids)}
    cu = np.asarray(batch.cu_num_logits_np)
    ids = grammar.structured_output_request_ids
    block = grammar.grammar_bitmask.shape[0] // len(ids)
    blocks = (rules or default_rules()).grammar_blocks
    rows, mask_rows = [], []
    for k, req_id in enumerate(ids):
        start, end = cu[position[req_id]], cu[position[req_id] + 1]
        rows.extend(range(start, end))
        if blocks:
            mask_rows.extend(range(k * block, k * block + end - start))
    vocab = logits.shape[1]
    words = grammar.grammar_bitmask.to(logits.device).to(torch.int64)
    if blocks:
        words = words[mask_rows]
    tokens = torch.arange(vocab, device=logits.device)
    allowed = ((words[:, tokens // 32] >> (tokens % 32)) & 1).bool()
    masked = logits.clone()
    masked[rows] = masked[rows].masked_fill(~allowed, -torch.inf)
    return masked


def toy_sample(
    logits: torch.Tensor,
    batch: InputBatch,
    grammar: GrammarOutput | None,
    num_logprobs: int | None,
    rules: Rules | None = None,
) -> SamplerOutput | None:
    """Sample ``batch`` from its full-vocab ``logits`` rows [L, V]. None if empty.

    ``batch.cu_num_logits_np`` must describe the rows of ``logits`` (a local batch does; see
    :func:`replicated_output` for a batch with admitted draft counts)."""
    if batch.num_reqs == 0:
        return None
    device = logits.device
    num_nans = torch.isnan(logits).sum(dim=1).to(torch.int32)
    processed = apply_grammar_bitmask(logits.float().nan_to_num(nan=-torch.inf), batch, grammar, rules)
    greedy = processed.argmax(dim=1)
    cu = np.asarray(batch.cu_num_logits_np, dtype=np.int64)
    counts = np.diff(cu)
    if batch.num_draft_tokens == 0:
        sampled = greedy[torch.from_numpy(cu[:-1]).to(device)].unsqueeze(1)
        num_sampled = torch.ones(batch.num_reqs, dtype=torch.int32, device=device)
    else:
        sampled, num_sampled = _toy_rejection(greedy.cpu().numpy(), cu, counts, device)
    logprobs = None if num_logprobs is None else _toy_logprobs(processed, greedy, num_logprobs)
    return SamplerOutput(
        sampled_token_ids=sampled,
        logprobs_tensors=logprobs,
        num_nans=num_nans,
        num_sampled=num_sampled,
        num_rejected=torch.from_numpy(counts).to(device, torch.int32) - num_sampled,
    )


def _toy_rejection(greedy: np.ndarray, cu: np.ndarray, counts: np.ndarray, device):
    width = int(counts.max())
    sampled = np.full((counts.shape[0], width), PLACEHOLDER_TOKEN_ID)  # int64, inferred from the fill value
    num_sampled = np.zeros(counts.shape[0], dtype=np.int32)
    for i, count in enumerate(counts):
        start, accepted = cu[i], 0
        while accepted < count - 1 and greedy[start + accepted] % 2 == 0:
            accepted += 1
        sampled[i, : accepted + 1] = greedy[start : start + accepted + 1]
        num_sampled[i] = accepted + 1
    return torch.from_numpy(sampled).to(device), torch.from_numpy(num_sampled).to(device)


def _toy_logprobs(processed: torch.Tensor, greedy: torch.Tensor, num_logprobs: int) -> LogprobsTensors:
    # float64 then rounded: float32 log_softmax differs by an ulp between CPU
    # builds (vector widths, torch versions), which would make goldens drift.
    logprobs = torch.log_softmax(processed.double(), dim=1).float()
    # A stable sort breaks ties by token id, so the result does not depend on
    # which other rows share the batch.
    order = torch.sort(logprobs, descending=True, stable=True).indices[:, :num_logprobs]
    sampled_logprob = logprobs.gather(1, greedy.unsqueeze(1))
    ids = torch.cat([greedy.unsqueeze(1), order], dim=1)
    values = torch.cat([sampled_logprob, logprobs.gather(1, order)], dim=1)
    ranks = (logprobs > sampled_logprob).sum(dim=1)
    return LogprobsTensors(ids, values, ranks)  # int64 indices and counts, float32 values


def replicated_output(
    logits: torch.Tensor,
    batch: InputBatch,
    grammar: GrammarOutput | None,
    *,
    gather_num_nans: bool,
    logprobs_dims: tuple[int, int] | None,
    rules: Rules | None = None,
    adaptive_verification_enabled: bool = False,
) -> SamplerOutput | None:
    """What the unsharded path yields, in the gathered output's conventions.

    Per-row NaN counts become per-request sums and logprobs take the agreed
    width (CL-REPLICATED-DIFFERENCES). ``logits`` are the rows of ``batch.logits_indices``: the admitted
    rows where admitted draft counts are given (CL-ADMITTED-DRAFTS).
    """
    num_logprobs = None if logprobs_dims is None else logprobs_dims[0]
    scheduled_cu = np.asarray(batch.cu_num_logits_np)
    rules = rules or default_rules()
    if rules.admits_drafts and batch.num_admitted_draft_tokens is not None:
        batch = replace(batch, cu_num_logits_np=admitted_cu_num_logits(batch))
    out = toy_sample(logits, batch, grammar, num_logprobs, rules)
    if out is None:
        return None
    cu = np.asarray(batch.cu_num_logits_np)
    owner = torch.from_numpy(np.repeat(np.arange(batch.num_reqs), np.diff(cu))).to(logits.device)
    nans = None
    if gather_num_nans:
        nans = torch.zeros(batch.num_reqs, dtype=torch.int64, device=logits.device)
        nans = nans.index_add_(0, owner, out.num_nans.to(torch.int64)).to(torch.int32)
    logprobs = None
    if logprobs_dims is not None:
        lp = out.logprobs_tensors
        cols = num_logprob_columns(logprobs_dims)
        ids = torch.zeros(lp.logprobs.shape[0], cols, dtype=torch.int64, device=logits.device)
        values = torch.full((lp.logprobs.shape[0], cols), -torch.inf, device=logits.device)
        copied = min(cols, lp.logprobs.shape[1])
        ids[:, :copied], values[:, :copied] = lp.logprob_token_ids[:, :copied], lp.logprobs[:, :copied]
        listed = [int(c) for c in scheduled_cu] if int(scheduled_cu[-1]) != batch.num_reqs else None
        logprobs = LogprobsTensors(
            ids,
            values,
            lp.selected_token_ranks,
            None if adaptive_verification_enabled else listed,
            batch.cu_num_logits.to(torch.int32, copy=True) if adaptive_verification_enabled else None,
        )
    return SamplerOutput(out.sampled_token_ids, logprobs, nans, out.num_sampled, out.num_rejected)
