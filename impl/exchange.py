"""Step 2, the exchange: the all-to-all of the vocab shards, and the one copy that lays each received row's
shards side by side.

The receive buffer is allocated per call (from the device's caching allocator, so a step of the same shape
gets last step's block back) and released once the reorder copy has read it: nothing the size of the logits
outlives the call except the result, which is the caller's.
"""

from __future__ import annotations

import torch

from shardspec.comm import Communicator
from shardspec.spec.model import BatchShardMetadata

# Received logits from this many bytes on are reordered as the widest words their rows divide into: 16-byte
# words (complex128, copied bit for bit like any other dtype), else 8 or 4 bytes.
_WIDEN_FROM_BYTES = 1 << 26
_WIDE_DTYPES = ((16, torch.complex128), (8, torch.int64), (4, torch.int32))


def _reorder(received: torch.Tensor, num_local: int, tp: int, width: int) -> torch.Tensor:
    """The all-to-all's chunks ``[tp * L_local, Vs]`` as rows ``[L_local, tp * Vs]``: one strided copy.

    torch's strided copy computes an index per element, so narrow elements move at a fraction of the copy rate
    (on an H200: bfloat16 1.6, float32 2.7, 16-byte words 4.0 TB/s, a contiguous copy 4.1; bench/NOTES.md); large
    buffers are therefore copied as the widest words their rows divide into, bit for bit the same values.
    """
    if width == 1:  # vocab == tp: reshaping the strided view would return a view, not contiguous rows
        return received.view(tp, num_local).t().contiguous()
    itemsize = received.element_size()
    row_bytes = width * itemsize
    if row_bytes * received.shape[0] >= _WIDEN_FROM_BYTES:
        for size, wide in _WIDE_DTYPES:
            if size > itemsize and row_bytes % size == 0 and row_bytes > size:
                words = row_bytes // size
                chunks = received.view(wide).as_strided((num_local, tp, words), (words, num_local * words, 1))
                return chunks.reshape(num_local, tp * words).view(received.dtype)
    chunks = received.as_strided((num_local, tp, width), (width, num_local * width, 1))
    return chunks.reshape(num_local, tp * width)


def exchange_logits(
    comm: Communicator, logits_shard: torch.Tensor, metadata: BatchShardMetadata, device: torch.device
) -> torch.Tensor:
    """[L, V/tp] owner-sorted rows of this rank's vocab shard -> [L_local, V], on ``device``."""
    tp, num_local, width = metadata.tp_size, metadata.num_local_logits, logits_shard.shape[-1]
    received = torch.empty((tp * num_local, width), dtype=logits_shard.dtype, device=device)
    comm.all_to_all_single(received, logits_shard.contiguous(), [num_local] * tp, metadata.num_logits_per_rank)
    if num_local > 1 and tp > 1:
        # Chunk r came from rank r, which holds vocab columns [r*Vs, (r+1)*Vs): the strided view reads the
        # chunks row-major, and reshaping it is the one copy that lays each row's shards side by side.
        return _reorder(received, num_local, tp, width)
    # One row (or one rank) is laid out as [L_local, V] already, and the buffer is no one else's.
    return received.view(num_local, tp * width)
