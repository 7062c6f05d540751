"""Precondition checks of the gather's and the exchange's inputs: the local sampler output
(PRE-LOCAL-OUTPUT, PRE-LOGPROBS-DIMS) and this rank's logits shard (PRE-LOGITS-SHARD). They read
shapes only; ``checks.py`` has those of the batch and the grammar output, ``extensions.py`` those of
the extension fields.
"""

from __future__ import annotations

import torch

from shardspec.spec.errors import PreconditionError
from shardspec.spec.model import BatchShardMetadata, SamplerOutput


def _fail(pid: str, field: str, message: str, rank=None) -> None:
    raise PreconditionError(pid, field, message, rank=rank)


def check_local_output(
    local_output: SamplerOutput | None,
    num_local_reqs: int,
    num_local_logits: int,
    *,
    gather_num_nans: bool,
    logprobs_dims,
    rank=None,
) -> None:
    # Replicated, so checked first: a rank that owns nothing rejects it too.
    if logprobs_dims is not None and (len(logprobs_dims) != 2 or min(logprobs_dims) < 0):
        _fail("PRE-LOGPROBS-DIMS", "logprobs_dims", f"{logprobs_dims} is not a pair of non-negative ints", rank=rank)
    if local_output is None:
        if num_local_reqs:
            _fail(
                "PRE-LOCAL-OUTPUT", "local_output", f"is None but this rank owns {num_local_reqs} requests", rank=rank
            )
        return
    ids = local_output.sampled_token_ids
    if ids.dim() != 2 or ids.shape[0] != num_local_reqs:
        _fail(
            "PRE-LOCAL-OUTPUT",
            "sampled_token_ids",
            f"shape {tuple(ids.shape)}; expected ({num_local_reqs}, width)",
            rank=rank,
        )
    expected = (("num_sampled", num_local_reqs), ("num_rejected", num_local_reqs))
    if gather_num_nans:
        expected += (("num_nans", num_local_logits),)
    for name, length in expected:
        value = getattr(local_output, name)
        if value is None or value.shape != (length,):
            shape = None if value is None else tuple(value.shape)
            _fail("PRE-LOCAL-OUTPUT", name, f"is {shape}; expected shape ({length},)", rank=rank)
    lp = local_output.logprobs_tensors
    if logprobs_dims is not None and lp is not None:
        for name in ("logprob_token_ids", "logprobs"):
            value = getattr(lp, name)
            if value.dim() != 2 or value.shape[0] != num_local_logits:
                _fail(
                    "PRE-LOCAL-OUTPUT",
                    name,
                    f"shape {tuple(value.shape)}; expected ({num_local_logits}, columns)",
                    rank=rank,
                )
        if lp.logprob_token_ids.shape != lp.logprobs.shape:
            _fail("PRE-LOCAL-OUTPUT", "logprobs", "logprob_token_ids and logprobs differ in shape", rank=rank)
        if lp.selected_token_ranks.shape != (num_local_logits,):
            _fail(
                "PRE-LOCAL-OUTPUT", "selected_token_ranks", f"shape {tuple(lp.selected_token_ranks.shape)}", rank=rank
            )


def check_logits_shard(logits_shard: torch.Tensor, metadata: BatchShardMetadata, rank) -> None:
    """PRE-LOGITS-SHARD, this rank's own shard only: that Vs is the same on every rank needs the peers."""
    num_logits = sum(metadata.num_logits_per_rank)
    if not isinstance(logits_shard, torch.Tensor) or not logits_shard.is_floating_point():
        _fail(
            "PRE-LOGITS-SHARD",
            "logits_shard",
            f"is {getattr(logits_shard, 'dtype', type(logits_shard).__name__)}, not a floating point tensor",
            rank=rank,
        )
    if logits_shard.dim() != 2 or logits_shard.shape[0] != num_logits or logits_shard.shape[1] < 1:
        _fail(
            "PRE-LOGITS-SHARD",
            "logits_shard",
            f"shape {tuple(logits_shard.shape)}; expected ({num_logits}, Vs) with Vs >= 1",
            rank=rank,
        )
