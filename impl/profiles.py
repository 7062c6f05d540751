"""Where the profiles differ (spec/SPEC.md section 7), on the host: each rule production applies per profile.

vllm-seed is what production did before profiles existed; vllm-0.33 adds admitted draft counts
(CL-ADMITTED-DRAFTS), the local batch's dtypes taken from the batch (CL-LOCAL-DTYPES), its draft count
(CL-LOCAL-DRAFT-COUNT) and seq_lens_cpu_upper_bound (CL-SEQ-LENS-UPPER-BOUND), and the gathered
cu_num_generated_tokens_tensor under adaptive verification (INV-CU-NUM-GENERATED). Grammar blocks are
in ``grammar.py``, the new preconditions in ``profile_checks.py``.

Nothing here waits for the device, and vllm-seed's steps call none of it: the sharder branches on the
host, so a vllm-seed step costs what it did before profiles existed.
"""

from __future__ import annotations

import numpy as np
import torch

from shardspec.spec.model import InputBatch

_NUMPY_INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def admitted_rows(batch: InputBatch, scheduled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(prefix sums [N + 1], rows per request [N]) of the admitted rows, int64: the scheduled rows
    ``scheduled`` less the drafts not admitted (CL-ADMITTED-DRAFTS). The device fields lay these out."""
    drafts = np.asarray(batch.num_draft_tokens_per_req).astype(np.int64)
    counts = scheduled - drafts + np.asarray(batch.num_admitted_draft_tokens).astype(np.int64)
    cu = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=cu[1:])
    return cu, counts


def admitted_cu(batch: InputBatch) -> np.ndarray:
    """[N + 1] int64 host prefix sums of the rows as a batch with admitted counts lays out its device
    fields (CL-ADMITTED-DRAFTS)."""
    return admitted_rows(batch, np.diff(batch.cu_num_logits_np))[0]  # int64: admitted_rows widens the counts


def local_dtypes(batch: InputBatch) -> tuple[torch.dtype, ...]:
    """vllm-0.33: the dtypes of the batch fields the local ones are cut from, in LOCAL_FIELDS order."""
    return (
        batch.idx_mapping.dtype,
        batch.cu_num_logits.dtype,
        batch.expanded_idx_mapping.dtype,
        batch.expanded_local_pos.dtype,
        batch.seq_lens.dtype,
    )


def local_033_fields(batch: InputBatch, local_reqs: np.ndarray, local_drafts: np.ndarray | None) -> tuple:
    """vllm-0.33's (num_draft_tokens, seq_lens_cpu_upper_bound, num_admitted_draft_tokens) of the local
    batch; ``local_drafts`` are the owned entries of num_draft_tokens_per_req. The draft count follows
    CL-LOCAL-DRAFT-COUNT, the bound is the owned entries (CL-SEQ-LENS-UPPER-BOUND) and the admitted
    counts are not carried (INV-LOCAL-ADMITTED-DRAFTS)."""
    admitted = batch.num_admitted_draft_tokens
    if local_drafts is None:
        num_drafts = 0
    elif admitted is not None:
        num_drafts = int(np.add.reduce(np.asarray(admitted)[local_reqs]))
    else:
        num_drafts = int(np.add.reduce(local_drafts)) if batch.num_draft_tokens > 0 else 0
    bound = batch.seq_lens_cpu_upper_bound
    if bound is not None:
        if bound.is_cpu and bound.dtype in _NUMPY_INTS:
            bound = torch.from_numpy(bound.numpy()[local_reqs])  # numpy's take costs less than torch's
        else:  # only with the checks off (PRE-SEQ-LENS-UPPER-BOUND)
            bound = bound.index_select(0, torch.from_numpy(local_reqs).to(bound.device))
    return num_drafts, bound, None


def adaptive_generated_tokens(global_batch: InputBatch, device: torch.device) -> tuple:
    """(cu_num_generated_tokens, cu_num_generated_tokens_tensor) of the gathered logprobs under adaptive
    verification (INV-CU-NUM-GENERATED): None, and a copy of the batch's cu_num_logits, int32, on
    ``device``. Without it they are the host list (when L != N) and None, as in vllm-seed."""
    return None, global_batch.cu_num_logits.to(device=device, dtype=torch.int32, copy=True)
