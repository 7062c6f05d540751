"""The shape buckets of the captured step (``shardspec_cuda_graph.py``) and what its padded wire costs in bytes."""

from __future__ import annotations

from dataclasses import dataclass

from shardspec.impl.kernels import next_power_of_2
from shardspec.spec.model import num_logprob_columns


@dataclass(frozen=True)
class Bucket:
    """``reqs_per_rank`` (P) requests per rank, ``rows_per_req`` (W) rows per request."""

    reqs_per_rank: int
    rows_per_req: int

    @property
    def rows_per_rank(self) -> int:
        """R = P * W: the rows every rank sends every rank on the padded wire."""
        return self.reqs_per_rank * self.rows_per_req


def bucket_for(reqs_per_rank: list[int], width: int) -> Bucket:
    """The smallest power-of-two bucket for a batch whose ranks own ``reqs_per_rank`` requests of at most
    ``width`` rows each."""
    return Bucket(next_power_of_2(max(1, max(reqs_per_rank, default=0))), next_power_of_2(max(1, width)))


def wire_bytes(
    num_logits_per_rank: list[int],
    reqs_per_rank: list[int],
    width: int,
    bucket: Bucket,
    *,
    vocab: int,
    itemsize: int,
    rank: int = 0,
    num_logprobs: int | None = None,
) -> dict:
    """Bytes one step puts on the wire, unpadded (the spec's wire) against padded (a captured bucket).

    ``a2a_*``: the logits all-to-all, what ``rank`` sends and receives (every chunk counted, its own
    included) and what the whole group sends. ``gather_*``: the all-gathers of sampled ids (+ NaN count)
    and, with ``num_logprobs``, of the logprobs (``num_logprobs + 1`` columns), received per rank.
    """
    tp = len(num_logits_per_rank)
    shard_bytes = vocab // tp * itemsize
    num_logits, rows = sum(num_logits_per_rank), bucket.rows_per_rank
    per_rank = max(reqs_per_rank, default=0)
    result = {
        "a2a_send_unpadded": num_logits * shard_bytes,
        "a2a_send_padded": tp * rows * shard_bytes,
        "a2a_receive_unpadded": tp * num_logits_per_rank[rank] * shard_bytes,
        "a2a_receive_padded": tp * rows * shard_bytes,
        "a2a_group_unpadded": tp * num_logits * shard_bytes,
        "a2a_group_padded": tp * tp * rows * shard_bytes,
    }

    def gathered(reqs: int, cols: int) -> int:
        sampled = tp * reqs * (cols + 3) * 8  # ids, num_sampled, num_rejected, num_nans as int64
        if num_logprobs is None:
            return sampled
        lp_cols = num_logprob_columns((num_logprobs, 0))
        return sampled + tp * reqs * cols * ((lp_cols + 1) * 8 + lp_cols * 4)

    result["gather_receive_unpadded"] = gathered(per_rank, width)
    result["gather_receive_padded"] = gathered(bucket.reqs_per_rank, bucket.rows_per_req)
    return result
