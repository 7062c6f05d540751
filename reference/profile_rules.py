"""Where the profiles differ (spec/rules.py): each rule the reference follows, in one place.

Each function takes a profile's :class:`~shardspec.spec.rules.Rules` and reads the one rule it follows:
admitted draft counts (CL-ADMITTED-DRAFTS), grammar rows or fixed-width blocks (CL-GRAMMAR-BLOCKS),
seq_lens_cpu_upper_bound (CL-SEQ-LENS-UPPER-BOUND), the local dtypes (CL-LOCAL-DTYPES), adaptive
verification (INV-CU-NUM-GENERATED).
"""

from __future__ import annotations

import numpy as np
import torch

from shardspec.spec.errors import PreconditionError
from shardspec.spec.model import GrammarOutput, InputBatch, admitted_cu_num_logits
from shardspec.spec.rules import Rules


def device_cu_num_logits(batch: InputBatch, rules: Rules) -> np.ndarray:
    """[N + 1] int64 prefix sums of the rows as the device fields lay them out: the admitted rows where
    the profile admits drafts (admitted_drafts: admitted), else cu_num_logits_np."""
    if rules.admits_drafts:
        return admitted_cu_num_logits(batch)
    return np.asarray(batch.cu_num_logits_np, dtype=np.int64)


def local_dtype(batch_field: torch.Tensor, seed_dtype: torch.dtype, rules: Rules) -> torch.dtype:
    """CL-LOCAL-DTYPES: the batch field's own dtype (local_dtypes: batch), or the fixed one (fixed)."""
    return batch_field.dtype if rules.batch_dtypes else seed_dtype


def local_num_draft_tokens(batch: InputBatch, local_reqs: np.ndarray, rules: Rules) -> int:
    """CL-LOCAL-DRAFT-COUNT for the owned requests ``local_reqs``."""
    drafts = batch.num_draft_tokens_per_req
    if drafts is None:
        return 0
    if not rules.admits_drafts:
        return int(np.asarray(drafts)[local_reqs].sum())
    if batch.num_admitted_draft_tokens is not None:
        return int(np.asarray(batch.num_admitted_draft_tokens)[local_reqs].sum())
    return int(np.asarray(drafts)[local_reqs].sum()) if batch.num_draft_tokens > 0 else 0


def local_profile_fields(batch: InputBatch, local_reqs: np.ndarray, rules: Rules) -> dict:
    """The local batch's seq_lens_cpu_upper_bound (CL-SEQ-LENS-UPPER-BOUND) and num_admitted_draft_tokens
    (INV-LOCAL-ADMITTED-DRAFTS) where the profile's rules make them the spec's; elsewhere they stay as
    the batch has them (INV-LOCAL-UNLISTED-FIELDS)."""
    fields = {}
    if rules.has_upper_bound:
        bound = batch.seq_lens_cpu_upper_bound
        local_bound = None if bound is None else bound[torch.from_numpy(local_reqs.astype(np.int64))]
        fields["seq_lens_cpu_upper_bound"] = local_bound
    if rules.admits_drafts:
        fields["num_admitted_draft_tokens"] = None
    return fields


def local_grammar_output(grammar: GrammarOutput | None, batch: InputBatch, local_reqs, rules: Rules):
    """INV-LOCAL-GRAMMAR: the owned requests' ids in the grammar's order, with their rows (grammar_slicing:
    rows) or whole blocks (blocks) and, where the profile slices them, acceptable-draft counts; None
    when none is owned."""
    if grammar is None:
        return None
    position = {req_id: i for i, req_id in enumerate(batch.req_ids)}
    owned = set(np.asarray(local_reqs).tolist())
    ids = grammar.structured_output_request_ids
    keep = [k for k, req_id in enumerate(ids) if position[req_id] in owned]
    if not keep:
        return None
    if rules.grammar_blocks:
        block = grammar.grammar_bitmask.shape[0] // len(ids)
        rows = [k * block + p for k in keep for p in range(block)]
        counts = grammar.num_acceptable_drafts if rules.acceptable_drafts == "sliced" else None
        return GrammarOutput(
            structured_output_request_ids=[ids[k] for k in keep],
            grammar_bitmask=grammar.grammar_bitmask[rows],
            num_acceptable_drafts=None if counts is None else [counts[k] for k in keep],
        )
    cu = np.asarray(batch.cu_num_logits_np)
    starts = np.concatenate([[0], np.cumsum([cu[position[r] + 1] - cu[position[r]] for r in ids])])
    rows = [r for k in keep for r in range(int(starts[k]), int(starts[k + 1]))]
    return GrammarOutput(
        structured_output_request_ids=[ids[k] for k in keep], grammar_bitmask=grammar.grammar_bitmask[rows]
    )


def gathered_cu_num_generated(global_batch: InputBatch, adaptive: bool, rules: Rules) -> dict:
    """INV-CU-NUM-GENERATED: the host list (without adaptive verification, when L != N) and, where the
    profile has adaptive verification, the device copy of cu_num_logits under it."""
    cu = np.asarray(global_batch.cu_num_logits_np)
    num_logits, num_reqs = int(cu[-1]), int(cu.shape[0] - 1)
    listed = [int(c) for c in cu] if num_logits != num_reqs else None
    if not rules.adaptive:
        return {"cu_num_generated_tokens": listed}
    if not adaptive:
        return {"cu_num_generated_tokens": listed, "cu_num_generated_tokens_tensor": None}
    device_cu = global_batch.cu_num_logits.to(torch.int32, copy=True)  # a tensor of its own, int32
    return {"cu_num_generated_tokens": None, "cu_num_generated_tokens_tensor": device_cu}


# ------------------------------------- preconditions of admitted drafts, the bound and grammar blocks


def _reject(pid: str, field: str, message: str, rank, request=None):
    raise PreconditionError(pid, field, message, request=request, rank=rank)


def check_admitted_drafts(batch: InputBatch, rank=None) -> None:
    """PRE-DRAFTS (admitted_drafts: admitted): num_admitted_draft_tokens, when given, is [N] integers within the
    scheduled drafts of each request."""
    admitted = batch.num_admitted_draft_tokens
    if admitted is None:
        return
    field = "num_admitted_draft_tokens"
    if batch.num_draft_tokens_per_req is None:
        _reject("PRE-DRAFTS", field, "is given without num_draft_tokens_per_req", rank)
    admitted = np.asarray(admitted)
    if not np.issubdtype(admitted.dtype, np.integer) or admitted.shape != (batch.num_reqs,):
        _reject(
            "PRE-DRAFTS",
            field,
            f"dtype {admitted.dtype}, shape {admitted.shape}: expected integers of shape ({batch.num_reqs},)",
            rank,
        )
    scheduled = np.asarray(batch.num_draft_tokens_per_req)
    if scheduled.shape != admitted.shape or not np.issubdtype(scheduled.dtype, np.integer):
        return  # the scheduled counts are malformed: PRE-DRAFTS names them (preconditions._check_drafts)
    bad = np.flatnonzero((admitted < 0) | (admitted.astype(np.int64) > scheduled.astype(np.int64)))
    if bad.size:
        _reject(
            "PRE-DRAFTS",
            field,
            f"{int(admitted[bad[0]])} admitted drafts, outside [0, {int(scheduled[bad[0]])}] scheduled",
            rank,
            int(bad[0]),
        )


def expected_num_draft_tokens(batch: InputBatch) -> int:
    """PRE-DRAFTS (admitted_drafts: admitted): num_draft_tokens sums the admitted counts where given."""
    if batch.num_admitted_draft_tokens is not None:
        return int(np.sum(batch.num_admitted_draft_tokens))
    return int(np.sum(batch.num_draft_tokens_per_req))


def check_seq_lens_upper_bound(batch: InputBatch, rank=None, required: bool = False) -> None:
    """PRE-SEQ-LENS-UPPER-BOUND; ``required``: None is refused too (seq_lens_upper_bound: always)."""
    bound = batch.seq_lens_cpu_upper_bound
    if bound is None:
        if required:
            _reject(
                "PRE-SEQ-LENS-UPPER-BOUND",
                "seq_lens_cpu_upper_bound",
                "is None: the profile's engine always passes it",
                rank,
            )
        return
    if not isinstance(bound, torch.Tensor) or bound.device.type != "cpu" or tuple(bound.shape) != (batch.num_reqs,):
        where = bound.device if isinstance(bound, torch.Tensor) else type(bound).__name__
        shape = tuple(getattr(bound, "shape", ()))
        _reject(
            "PRE-SEQ-LENS-UPPER-BOUND",
            "seq_lens_cpu_upper_bound",
            f"{where}, shape {shape}: expected a CPU tensor of shape ({batch.num_reqs},)",
            rank,
        )


def check_grammar_blocks(grammar: GrammarOutput, batch: InputBatch, rank=None) -> None:
    """PRE-GRAMMAR-BITMASK (grammar_slicing: blocks): G blocks of S rows, S >= every listed request's scheduled rows."""
    ids = grammar.structured_output_request_ids
    bitmask = grammar.grammar_bitmask
    counts = grammar.num_acceptable_drafts
    if counts is not None and len(counts) != len(ids):
        _reject(
            "PRE-GRAMMAR-BITMASK",
            "num_acceptable_drafts",
            f"{len(counts)} entries for {len(ids)} listed requests",
            rank,
        )
    if bitmask.dim() != 2 or (not ids and bitmask.shape[0] != 0):
        _reject("PRE-GRAMMAR-BITMASK", "grammar_bitmask", f"shape {tuple(bitmask.shape)}: expected [G * S, B]", rank)
    if not ids:
        return
    if bitmask.shape[0] % len(ids):
        _reject(
            "PRE-GRAMMAR-BITMASK",
            "grammar_bitmask",
            f"{bitmask.shape[0]} rows are not a block per each of {len(ids)} listed requests",
            rank,
        )
    block = bitmask.shape[0] // len(ids)
    position = {req_id: i for i, req_id in enumerate(batch.req_ids)}
    scheduled = np.diff(batch.cu_num_logits_np)
    for req_id in ids:
        if scheduled[position[req_id]] > block:
            _reject(
                "PRE-GRAMMAR-BITMASK",
                "grammar_bitmask",
                f"blocks of {block} rows, but request {req_id!r} has {int(scheduled[position[req_id]])} logits rows",
                rank,
                position[req_id],
            )


def num_gathered_logprob_rows(global_batch: InputBatch) -> int:
    """INV-LOGPROBS-SHAPES: Ls = cu_num_logits_np[N] rows (L unless admitted counts are given)."""
    return int(np.asarray(global_batch.cu_num_logits_np)[-1])
