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

from shardspec.spec.profiles import DEFAULT_PROFILE, PROFILES, rules_of  # noqa: F401  (re-exported)


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
    # Profile rule seq_lens_upper_bound (spec/rules.py). [N] int32 host tensor: an upper bound of seq_lens known on
    # the host; localized like seq_lens (CL-SEQ-LENS-UPPER-BOUND).
    seq_lens_cpu_upper_bound: torch.Tensor | None = None
    # Rule admitted_drafts: admitted. [N] host int array: the draft tokens admitted per request under adaptive
    # verification when the budget binds, else None. With it, cu_num_logits (device) holds the admitted
    # prefix sums and cu_num_logits_np the scheduled ones (CL-ADMITTED-DRAFTS).
    num_admitted_draft_tokens: np.ndarray | None = None

    @property
    def num_logits(self) -> int:
        """cu_num_logits_np[N]. For a replicated batch with admitted counts these are the scheduled rows;
        :func:`logits_per_req` gives the admitted ones."""
        return int(self.cu_num_logits_np[-1])


def logits_per_req(batch: InputBatch) -> np.ndarray:
    """[N] int64 logits rows of each request of a replicated batch: the scheduled rows of
    cu_num_logits_np, less the drafts not admitted where admitted counts are given (CL-ADMITTED-DRAFTS).

    Only for a batch passed to shard_sampler_inputs: a local batch's cu_num_logits_np already holds the
    admitted counts, and its num_admitted_draft_tokens is not read (CL-ADMITTED-DRAFTS).
    """
    scheduled = np.diff(np.asarray(batch.cu_num_logits_np, dtype=np.int64))
    admitted = batch.num_admitted_draft_tokens
    if admitted is None or batch.num_draft_tokens_per_req is None:
        return scheduled
    drafts = np.asarray(batch.num_draft_tokens_per_req, dtype=np.int64)
    return scheduled - drafts + np.asarray(admitted, dtype=np.int64)


def admitted_cu_num_logits(batch: InputBatch) -> np.ndarray:
    """[N + 1] int64 prefix sums of :func:`logits_per_req`: the rows as the device fields lay them out."""
    cu = np.zeros(batch.num_reqs + 1, dtype=np.int64)
    np.cumsum(logits_per_req(batch), out=cu[1:])
    return cu


@dataclass
class GrammarOutput:
    """Structured-output bitmasks for a subset of the batch."""

    # Request ids in any order; a subset of the batch.
    structured_output_request_ids: list[str]
    # [sum of n_i over those requests, ceil(V/32)] int32; rows grouped per
    # request in list order. Bit b of word w clear => token 32*w+b is masked.
    # Rule grammar_slicing: blocks: a fixed-width block of S rows per listed request (CL-GRAMMAR-BLOCKS).
    grammar_bitmask: torch.Tensor
    # Rule acceptable_drafts: sliced: [G] per listed request, how many leading drafts the bitmask constrained; or None.
    num_acceptable_drafts: list[int] | None = None


class LogprobsTensors(NamedTuple):
    # [L, C] int64; column 0 holds the sampled token.
    logprob_token_ids: torch.Tensor
    # [L, C] float32.
    logprobs: torch.Tensor
    # [L] int64 rank of the sampled token.
    selected_token_ranks: torch.Tensor
    # Prefix sum of generated tokens per request, or None.
    cu_num_generated_tokens: list[int] | None = None
    # Rule adaptive_verification: present: [N+1] int32 device prefix sums, set instead of cu_num_generated_tokens under
    # adaptive verification (CL-ADMITTED-DRAFTS); else None.
    cu_num_generated_tokens_tensor: torch.Tensor | None = None


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
    # Rule adaptive_verification: present: the sharder's adaptive_verification_enabled (CL-ADMITTED-DRAFTS).
    adaptive_verification_enabled: bool = False


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
