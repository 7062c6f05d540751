"""The owning rank's part of the grammar output (host-side slicing of the bitmask rows)."""

from __future__ import annotations

import numpy as np
import torch

from shardspec.spec.model import GrammarOutput


def local_grammar_output(
    grammar: GrammarOutput,
    position: dict,
    owned: np.ndarray,
    cu: np.ndarray,
    blocks: bool = False,
    acceptable: bool = True,
) -> GrammarOutput | None:
    """The owned requests' ids (grammar order) and a copy of their bitmask rows; None if none is owned.

    ``position`` maps a request id to its batch position, ``owned`` is a boolean per batch
    position and ``cu`` the batch's host prefix sum of logits rows (grammar_slicing rows: one bitmask row
    per logits row). ``blocks`` (grammar_slicing blocks, CL-GRAMMAR-BLOCKS): a block of S = rows / G rows
    per listed request instead, kept whole, with the owned entries of num_acceptable_drafts where
    ``acceptable`` (acceptable_drafts sliced).
    """
    ids = grammar.structured_output_request_ids
    if not ids:
        return None
    listed = np.fromiter((position[r] for r in ids), dtype=np.int64)
    kept = owned[listed]
    if not kept.any():
        return None
    if blocks:
        return _local_blocks(grammar, np.flatnonzero(kept), acceptable)
    counts = cu[listed + 1] - cu[listed]
    starts = np.cumsum(counts) - counts  # first bitmask row of each listed request
    kept_counts = counts[kept]
    offsets = np.arange(int(kept_counts.sum())) - np.repeat(np.cumsum(kept_counts) - kept_counts, kept_counts)
    rows = np.repeat(starts[kept], kept_counts) + offsets
    bitmask = grammar.grammar_bitmask
    return GrammarOutput(
        structured_output_request_ids=[ids[k] for k in np.flatnonzero(kept).tolist()],
        grammar_bitmask=bitmask.index_select(0, _to_device(rows, bitmask.device)),
    )


def _local_blocks(grammar: GrammarOutput, kept: np.ndarray, acceptable: bool = True) -> GrammarOutput:
    """The listed requests ``kept`` (indices into the grammar's list), their blocks and counts."""
    ids, bitmask = grammar.structured_output_request_ids, grammar.grammar_bitmask
    counts = grammar.num_acceptable_drafts if acceptable else None
    block = bitmask.shape[0] // len(ids)
    rows = (kept[:, None] * block + np.arange(block)).ravel()
    kept_list = kept.tolist()
    return GrammarOutput(
        structured_output_request_ids=[ids[k] for k in kept_list],
        grammar_bitmask=bitmask.index_select(0, _to_device(rows, bitmask.device)),
        num_acceptable_drafts=None if counts is None else [counts[k] for k in kept_list],
    )


def _to_device(values: np.ndarray, device: torch.device) -> torch.Tensor:
    """int64 host values on ``device`` without a synchronizing copy (pinned staging on CUDA)."""
    host = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
    if device.type != "cuda":
        return host.to(device)
    staged = torch.empty(host.shape, dtype=torch.int64, pin_memory=True)
    staged.copy_(host)
    return staged.to(device, non_blocking=True)
