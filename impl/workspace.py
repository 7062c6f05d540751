"""Preallocated buffers: one byte buffer carved into typed, 16-byte aligned regions.

Regions are sized for the sharder's capacity once; a step uses leading slices
of them, so no step allocates device memory for its plan or wire buffers.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

ALIGN_BYTES = 16


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES


def carve(layout: Iterable[tuple[str, torch.dtype, int]], device, *, buffer: torch.Tensor | None = None) -> dict:
    """Typed 1-D regions ``{name: tensor}`` of one byte buffer, each 16-byte aligned.

    ``layout`` lists (name, dtype, numel). A fresh buffer is allocated unless
    one is given (then it must be large enough: see :func:`layout_bytes`).
    """
    layout = list(layout)
    if buffer is None:
        buffer = torch.empty(layout_bytes(layout), dtype=torch.uint8, device=device)
    regions, offset = {}, 0
    for name, dtype, numel in layout:
        nbytes = numel * dtype.itemsize
        regions[name] = buffer[offset : offset + nbytes].view(dtype)
        offset += _aligned(nbytes)
    return regions


def layout_bytes(layout: Iterable[tuple[str, torch.dtype, int]]) -> int:
    return sum(_aligned(numel * dtype.itemsize) for _, dtype, numel in layout)


# The local batch's device fields that take a dtype from the batch in profile vllm-0.33 (CL-LOCAL-DTYPES),
# in the order of ``local_dtypes``; each has an int32 region and an int64 one (``<name>_int64``).
LOCAL_FIELDS = ("idx_mapping", "cu_num_logits", "expanded_idx_mapping", "expanded_local_pos", "seq_lens")
REGION_DTYPES = (torch.int32, torch.int64)


def local_region(name: str, dtype: torch.dtype) -> str:
    """The region the kernel writes local field ``name`` of ``dtype`` into (int32 for other dtypes,
    which the sharder converts afterwards)."""
    return f"local_{name}_int64" if dtype == torch.int64 else f"local_{name}"


def plan_layout(max_num_reqs: int, max_num_logits_per_req: int, tp_size: int) -> list:
    """Regions of the shard plan and of the sampled-output all-gather, at capacity."""
    reqs, rows = max_num_reqs, max_num_reqs * max_num_logits_per_req
    sampled = max(1, reqs) * (max_num_logits_per_req + 3)
    local = {"idx_mapping": reqs, "cu_num_logits": reqs + 1, "expanded_idx_mapping": rows}
    local.update(expanded_local_pos=rows, seq_lens=reqs)
    return [
        ("sorted_logits_indices", torch.int64, rows),
        ("gathered_src_indices", torch.int64, reqs),
        ("local_logits_indices", torch.int64, rows),
        *((local_region(name, dtype), dtype, local[name]) for dtype in REGION_DTYPES for name in LOCAL_FIELDS),
        ("send_sampled", torch.int64, sampled),
        ("recv_sampled", torch.int64, tp_size * sampled),
    ]


def logprobs_layout(max_num_reqs: int, max_num_logits_per_req: int, tp_size: int, num_cols: int) -> list:
    """Regions of the two logprob all-gathers for ``num_cols`` logprob columns."""
    rows = max(1, max_num_reqs) * max_num_logits_per_req
    return [
        ("send_ids", torch.int64, rows * (num_cols + 1)),
        ("send_vals", torch.float32, rows * num_cols),
        ("recv_ids", torch.int64, tp_size * rows * (num_cols + 1)),
        ("recv_vals", torch.float32, tp_size * rows * num_cols),
    ]
