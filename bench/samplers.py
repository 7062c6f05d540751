"""Torch samplers for the replicated and the sharded step: greedy and two top-p samplers.

Each samples every row of ``logits`` ([rows, vocab], any float dtype) and returns int64 token ids.
``top_p`` follows the usual torch recipe (softmax in float32, sort, cumulative sum, mask, scatter back,
an exponential race for the draw): several full passes and temporaries over the logits, which is
what makes sampling every row on every rank expensive in time and memory. Its temporaries are not
linear in rows: torch's CUDA sort works through at most 2**31 - 1 elements at a time, so a batch
above that needs fewer bytes per element than one below it (``sort_memory.py`` measures it).
``top_p_sort_free`` keeps the same tokens without a sort (a bisection on the probability threshold,
as sort-free GPU samplers do): its temporaries are a fixed number of bytes per element at any size.
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


def top_p_sort_free(logits: torch.Tensor, generator=None, p: float = TOP_P, steps: int = 32) -> torch.Tensor:
    """Keeps the tokens whose probability is at least the largest threshold t with mass(t) >= p.

    mass(t) is the total probability of the tokens at or above t, so the kept set is the smallest
    prefix of the sorted tokens whose mass reaches p (ties at t aside), the set ``top_p`` keeps.
    Bisection on t: ``low`` always has mass >= p (mass(0) = 1), ``high`` never does (above the max).
    """
    probs = logits.float().softmax(dim=-1)
    low = torch.zeros(probs.shape[0], 1, device=probs.device)
    high = probs.amax(dim=-1, keepdim=True) * 2
    for _ in range(steps):
        middle = (low + high) / 2
        enough = torch.where(probs >= middle, probs, 0.0).sum(dim=-1, keepdim=True) >= p
        low, high = torch.where(enough, middle, low), torch.where(enough, high, middle)
    kept = probs.masked_fill_(probs < low, 0.0)
    race = torch.empty_like(kept).exponential_(generator=generator)
    return kept.div_(race).argmax(dim=-1)


SAMPLERS = {"greedy": greedy, "top_p": top_p, "top_p_sort_free": top_p_sort_free}


def temporaries_bytes(sampler: str, rows: int, vocab: int) -> int:
    """About how many bytes of temporaries ``sampler`` allocates for [rows, vocab] (for skipping, not reporting)."""
    if sampler == "greedy":
        return rows * 8
    if sampler == "top_p_sort_free":
        return rows * vocab * (4 + 4 + 1)  # probs, the masked copy, the mask
    # probs, sorted values, sort indices (int64), cumsum, mask, scattered probs, race: float32 unless noted.
    return rows * vocab * (4 + 4 + 8 + 4 + 1 + 4 + 4)
