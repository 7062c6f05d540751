"""Torch samplers for the replicated and the sharded step: greedy and top-p.

Both sample every row of ``logits`` ([rows, vocab], any float dtype) and return int64 token ids.
Top-p follows the usual torch recipe (softmax in float32, sort, cumulative sum, mask, scatter back,
an exponential race for the draw): several full passes and temporaries over the logits, which is
what makes sampling every row on every rank expensive in time and memory.
"""

from __future__ import annotations

import torch

TOP_P = 0.9


def greedy(logits: torch.Tensor, generator=None) -> torch.Tensor:
    return logits.argmax(dim=-1)


def top_p(logits: torch.Tensor, generator=None, p: float = TOP_P) -> torch.Tensor:
    probs = logits.float().softmax(dim=-1)
    sorted_probs, order = probs.sort(dim=-1)
    # Ascending order: drop the smallest tokens whose total stays within 1 - p; the largest always stays.
    drop = sorted_probs.cumsum(dim=-1) <= 1 - p
    drop[:, -1] = False
    sorted_probs.masked_fill_(drop, 0.0)
    kept = torch.empty_like(probs).scatter_(-1, order, sorted_probs)
    race = torch.empty_like(kept).exponential_(generator=generator)
    return kept.div_(race).argmax(dim=-1)


SAMPLERS = {"greedy": greedy, "top_p": top_p}


def temporaries_bytes(sampler: str, rows: int, vocab: int) -> int:
    """About how many bytes of temporaries ``sampler`` allocates for [rows, vocab] (for skipping, not reporting)."""
    if sampler == "greedy":
        return rows * 8
    # probs, sorted values, sort indices (int64), cumsum, mask, scattered probs, race: float32 unless noted.
    return rows * vocab * (4 + 4 + 8 + 4 + 1 + 4 + 4)
