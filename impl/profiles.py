"""Where the profiles differ (spec/SPEC.md section 7, spec/rules.py), on the host: what production does
for the rule values beyond the root profile's.

Admitted draft counts (admitted_drafts: admitted, CL-ADMITTED-DRAFTS) and the local batch's draft count
(CL-LOCAL-DRAFT-COUNT), the local dtypes taken from the batch (local_dtypes: batch, CL-LOCAL-DTYPES),
seq_lens_cpu_upper_bound (CL-SEQ-LENS-UPPER-BOUND), and the gathered cu_num_generated_tokens_tensor under
adaptive verification (INV-CU-NUM-GENERATED). Grammar blocks are in ``grammar.py``, the preconditions
these rules add in ``profile_checks.py``.

Nothing here waits for the device, and the root profile's steps call none of it: the sharder branches
on the host, so such a step costs what it did before profiles existed.
"""

from __future__ import annotations

import numpy as np
import torch

from shardspec.spec.model import InputBatch
from shardspec.spec.rules import Rules

_NUMPY_INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
# The owner rules production implements (spec/rules.py).
OWNER_RULES = ("slot_mod_tp", "position_mod_tp", "owner_table", "contiguous_ranges")
# The owner rules whose owners the host finds and the plan kernel reads (the others the kernel computes).
HOST_OWNER_RULES = ("owner_table", "contiguous_ranges")
# The owner rules under which the owners depend on the number of requests alone.
POSITION_OWNER_RULES = ("position_mod_tp", "contiguous_ranges")


def check_owner_rule(rules: Rules) -> None:
    """NotImplementedError for an owner rule production does not implement yet."""
    if rules.owner not in OWNER_RULES:
        raise NotImplementedError(
            f"owner rule {rules.owner}: not supported yet (production has {', '.join(OWNER_RULES)})"
        )


def owners(slots: np.ndarray, tp: int, owner: str) -> np.ndarray:
    """[N] owner rank of each batch position (INV-OWNER): its slot mod tp (slot_mod_tp) or its position
    mod tp (position_mod_tp), or its range's rank (contiguous_ranges); owner_table's owners come from
    ``profile_checks.table_owners``. Vectorised forms of spec/rule_meanings.py's definitions, held equal to
    them by tests/impl/test_impl_rule_meanings.py. tp is usually a power of two, and a mask is cheaper than
    a division."""
    if owner == "contiguous_ranges":
        return range_owners(slots.shape[0], tp)
    keys = np.arange(slots.shape[0], dtype=np.intp) if owner == "position_mod_tp" else slots
    return np.bitwise_and(keys, tp - 1) if tp & (tp - 1) == 0 else np.remainder(keys, tp)


def range_owners(num_reqs: int, tp: int) -> np.ndarray:
    """[N] owners under contiguous_ranges (CL-OWNER-CONTIGUOUS-RANGES): rank r's range of batch positions
    holds N // tp of them, one more for the first N % tp ranks."""
    size, extra = divmod(num_reqs, tp)
    lengths = np.full(tp, size, dtype=np.intp)
    lengths[:extra] += 1
    return np.repeat(np.arange(tp, dtype=np.intp), lengths)


def padded_reqs_per_rank(reqs_per_rank: list[int], num_reqs: int) -> int:
    """max_num_reqs_per_rank: the largest rank's requests, 1 for an empty batch (CL-EMPTY-BATCH: the
    largest choice of every empty_batch_padding value, as the reference pads)."""
    return max(reqs_per_rank) if num_reqs else 1


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
    """local_dtypes batch: the dtypes of the batch fields the local ones are cut from, in LOCAL_FIELDS order."""
    return (
        batch.idx_mapping.dtype,
        batch.cu_num_logits.dtype,
        batch.expanded_idx_mapping.dtype,
        batch.expanded_local_pos.dtype,
        batch.seq_lens.dtype,
    )


def local_profile_fields(batch: InputBatch, local_reqs: np.ndarray, local_drafts: np.ndarray | None, rules) -> tuple:
    """(num_draft_tokens, seq_lens_cpu_upper_bound, num_admitted_draft_tokens) of the local batch under
    ``rules``; ``local_drafts`` are the owned entries of num_draft_tokens_per_req. Where drafts are
    admitted, the draft count follows CL-LOCAL-DRAFT-COUNT and the admitted counts are not carried
    (INV-LOCAL-ADMITTED-DRAFTS); where the bound is the spec's, it is the owned entries
    (CL-SEQ-LENS-UPPER-BOUND). Elsewhere the batch's own values stay (INV-LOCAL-UNLISTED-FIELDS)."""
    admitted = batch.num_admitted_draft_tokens
    if local_drafts is None:
        num_drafts = 0
    elif not rules.admits_drafts:
        num_drafts = int(np.add.reduce(local_drafts))
    elif admitted is not None:
        num_drafts = int(np.add.reduce(np.asarray(admitted)[local_reqs]))
    else:
        num_drafts = int(np.add.reduce(local_drafts)) if batch.num_draft_tokens > 0 else 0
    carried = None if rules.admits_drafts else admitted
    bound = batch.seq_lens_cpu_upper_bound
    if not rules.has_upper_bound:
        return num_drafts, bound, carried
    if bound is not None:
        if bound.is_cpu and bound.dtype in _NUMPY_INTS:
            bound = torch.from_numpy(bound.numpy()[local_reqs])  # numpy's take costs less than torch's
        else:  # only with the checks off (PRE-SEQ-LENS-UPPER-BOUND)
            bound = bound.index_select(0, torch.from_numpy(local_reqs).to(bound.device))
    return num_drafts, bound, carried


def adaptive_generated_tokens(global_batch: InputBatch, device: torch.device) -> tuple:
    """(cu_num_generated_tokens, cu_num_generated_tokens_tensor) of the gathered logprobs under adaptive
    verification (INV-CU-NUM-GENERATED): None, and a copy of the batch's cu_num_logits, int32, on
    ``device``. Without it they are the host list (when L != N) and None, as in vllm-seed."""
    return None, global_batch.cu_num_logits.to(device=device, dtype=torch.int32, copy=True)
