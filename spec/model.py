"""Data model of one batch-sharded sampling step.

Field names follow upstream (vLLM Model Runner V2) so that adapting an
upstream-style implementation is a thin layer. Shapes, dtypes and placement
of every field are specified in ``spec/data_model.yaml``; tests keep the two in
step. ``N`` is the number of requests, ``L`` the number of logits rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch


@dataclass
class InputBatch:
    """The batch as the sampler sees it, replicated on every rank."""

    req_ids: list[str]
    num_reqs: int
    # [N] slot of each batch position; int64 on device (int32 in a local batch).
    idx_mapping: torch.Tensor
    # [N] host copy of idx_mapping, np.intp.
    idx_mapping_np: np.ndarray
    # [L] slot of the request each logits row belongs to, int32.
    expanded_idx_mapping: torch.Tensor
    # [L] position of a logits row inside its request (0..n_i-1), int32.
    expanded_local_pos: torch.Tensor
    # [N+1] token offsets of each request's query, int32. Token space: stays global.
    query_start_loc: torch.Tensor
    # [N] sequence length of each request, int32.
    seq_lens: torch.Tensor
    # [L] token index of each logits row, int64.
    logits_indices: torch.Tensor
    # [N+1] prefix sum of logits rows per request, int32, and its host copy.
    cu_num_logits: torch.Tensor
    cu_num_logits_np: np.ndarray
    # Total number of draft tokens and, with speculative decoding, the count
    # per request (host, int32), else None.
    num_draft_tokens: int = 0
    num_draft_tokens_per_req: np.ndarray | None = None

    @property
    def num_logits(self) -> int:
        return int(self.cu_num_logits_np[-1])


@dataclass
class GrammarOutput:
    """Structured-output bitmasks for a subset of the batch."""

    # Request ids in any order; a subset of the batch.
    structured_output_request_ids: list[str]
    # [sum of n_i over those requests, ceil(V/32)] int32; rows grouped per
    # request in list order. Bit b of word w clear => token 32*w+b is masked.
    grammar_bitmask: torch.Tensor


class LogprobsTensors(NamedTuple):
    # [L, C] int64; column 0 holds the sampled token.
    logprob_token_ids: torch.Tensor
    # [L, C] float32.
    logprobs: torch.Tensor
    # [L] int64 rank of the sampled token.
    selected_token_ranks: torch.Tensor
    # Prefix sum of generated tokens per request, or None.
    cu_num_generated_tokens: list[int] | None = None


@dataclass
class SamplerOutput:
    # [N, W] int64 sampled ids per request.
    sampled_token_ids: torch.Tensor
    logprobs_tensors: LogprobsTensors | None = None
    # Local sampler: [L_local] per logits row. Gathered: [N] int32 per request.
    num_nans: torch.Tensor | None = None
    # [N] int32.
    num_sampled: torch.Tensor | None = None
    # [N] int32.
    num_rejected: torch.Tensor | None = None
    # Extension fields: tensors a sampler returns beyond the named fields
    # (e.g. sampling masks), by name. Local: [n, *E] or [L_local, *E] as the
    # field's ExtensionSpec declares; gathered: [N, *E] or [L, *E] in batch order.
    extensions: dict[str, torch.Tensor] | None = None


@dataclass(frozen=True)
class ExtensionSpec:
    """The replicated declaration of one extension field, passed to the gather on every rank."""

    # "request": one entry per request; "logits_row": one entry per logits row.
    per: str
    # The field's dtype on every rank (EXTENSION_DTYPES).
    dtype: torch.dtype
    # Trailing shape E of one entry; () for one scalar per request or row.
    shape: tuple[int, ...] = ()


EXTENSION_KINDS = ("request", "logits_row")
# The dtypes an extension field may have (PRE-EXTENSION-SUPPORTED); int16 is left out because
# gloo's all-gather rejects it ("Invalid scalar type", torch 2.13).
EXTENSION_DTYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
)


@dataclass
class BatchShardMetadata:
    """The collective plan of one step; a pure function of replicated inputs."""

    tp_size: int
    # Logits rows owned by each rank: the all-to-all send split sizes.
    num_logits_per_rank: list[int]
    num_local_logits: int
    num_local_reqs: int
    # Request entries each rank contributes to the all-gather (padded).
    max_num_reqs_per_rank: int
    # [N] int64: row of batch request i in the rank-major gathered results.
    gathered_src_indices: torch.Tensor
    # Entries per request in the gathered sampled ids (the agreed width).
    max_num_logits_per_req: int


class ShardResult(NamedTuple):
    """What ``shard_sampler_inputs`` returns."""

    local_batch: InputBatch
    # [L] int64 token indices in owner-sorted order (the all-to-all send order).
    sorted_logits_indices: torch.Tensor
    local_grammar_output: GrammarOutput | None
    metadata: BatchShardMetadata


def num_logprob_columns(logprobs_dims: tuple[int, int]) -> int:
    """Agreed logprob width: the sampled token plus max(k, max_token_ids)."""
    num_logprobs, max_token_ids = logprobs_dims
    return 1 + max(num_logprobs, max_token_ids)
