"""The preconditions vllm-0.33 adds or changes (spec/SPEC.md section 7.1), checked on the host.

PRE-DRAFTS with admitted counts, PRE-SEQ-LENS-UPPER-BOUND and PRE-GRAMMAR-BITMASK's blocks;
PRE-HOST-DEVICE-MATCH against the admitted prefix sums is ``checks.check_input_batch``'s, which calls
these in the reference's order so that a batch breaking several names the same one.
"""

from __future__ import annotations

import numpy as np
import torch

from shardspec.spec.errors import PreconditionError
from shardspec.spec.model import GrammarOutput, InputBatch


def _fail(pid: str, field: str, message: str, request=None, rank=None) -> None:
    raise PreconditionError(pid, field, message, request=request, rank=rank)


def check_admitted_drafts(batch: InputBatch, rank) -> None:
    """PRE-DRAFTS: num_admitted_draft_tokens, where given, is [N] integers, 0 <= admitted[i] <=
    num_draft_tokens_per_req[i] (which must then be given, of shape [N])."""
    admitted = batch.num_admitted_draft_tokens
    if admitted is None:
        return
    field = "num_admitted_draft_tokens"
    drafts = batch.num_draft_tokens_per_req
    if drafts is None:
        _fail("PRE-DRAFTS", field, "is given without num_draft_tokens_per_req", rank=rank)
    admitted, drafts = np.asarray(admitted), np.asarray(drafts)
    num_reqs = batch.num_reqs
    if admitted.dtype.kind not in ("i", "u") or admitted.shape != (num_reqs,):
        _fail(
            "PRE-DRAFTS",
            field,
            f"dtype {admitted.dtype}, shape {admitted.shape}: expected integers of shape ({num_reqs},)",
            rank=rank,
        )
    if drafts.shape != (num_reqs,):
        _fail("PRE-DRAFTS", "num_draft_tokens_per_req", f"shape {drafts.shape}, expected ({num_reqs},)", rank=rank)
    wide = admitted.astype(np.int64)
    outside = (wide < 0) | (wide > drafts.astype(np.int64))
    if np.logical_or.reduce(outside):
        bad = int(np.flatnonzero(outside)[0])
        _fail(
            "PRE-DRAFTS",
            field,
            f"{int(admitted[bad])} admitted drafts, outside [0, {int(drafts[bad])}] scheduled",
            request=bad,
            rank=rank,
        )


def check_seq_lens_upper_bound(batch: InputBatch, rank, required: bool = False) -> None:
    """PRE-SEQ-LENS-UPPER-BOUND: a CPU tensor of N entries, or None where not ``required``."""
    bound = batch.seq_lens_cpu_upper_bound
    if bound is None:
        if required:
            _fail("PRE-SEQ-LENS-UPPER-BOUND", "seq_lens_cpu_upper_bound", "None, though always passed", rank=rank)
        return
    if not isinstance(bound, torch.Tensor) or not bound.is_cpu or bound.shape != (batch.num_reqs,):
        where = bound.device if isinstance(bound, torch.Tensor) else type(bound).__name__
        _fail(
            "PRE-SEQ-LENS-UPPER-BOUND",
            "seq_lens_cpu_upper_bound",
            f"{where}, shape {tuple(getattr(bound, 'shape', ()))}: expected a CPU tensor of shape ({batch.num_reqs},)",
            rank=rank,
        )


def check_grammar_blocks(grammar: GrammarOutput, batch: InputBatch, position: dict, rank) -> None:
    """PRE-GRAMMAR-BITMASK: G blocks of S rows, S at least every listed request's scheduled rows, and
    num_acceptable_drafts None or G entries. The ids are checked (PRE-GRAMMAR-IDS) before."""
    ids = grammar.structured_output_request_ids
    bitmask = grammar.grammar_bitmask
    counts = grammar.num_acceptable_drafts
    if counts is not None and len(counts) != len(ids):
        _fail(
            "PRE-GRAMMAR-BITMASK",
            "num_acceptable_drafts",
            f"{len(counts)} entries for {len(ids)} listed requests",
            rank=rank,
        )
    if bitmask.dim() != 2 or (not ids and bitmask.shape[0] != 0):
        _fail("PRE-GRAMMAR-BITMASK", "grammar_bitmask", f"shape {tuple(bitmask.shape)}: expected [G * S, B]", rank=rank)
    if not ids:
        return
    block, rest = divmod(bitmask.shape[0], len(ids))
    if rest:
        _fail(
            "PRE-GRAMMAR-BITMASK",
            "grammar_bitmask",
            f"{bitmask.shape[0]} rows are not a block per each of {len(ids)} listed requests",
            rank=rank,
        )
    cu = batch.cu_num_logits_np
    listed = np.fromiter((position[r] for r in ids), dtype=np.int64)
    scheduled = cu[listed + 1].astype(np.int64) - cu[listed]
    if np.maximum.reduce(scheduled) > block:
        k = int(np.flatnonzero(scheduled > block)[0])
        _fail(
            "PRE-GRAMMAR-BITMASK",
            "grammar_bitmask",
            f"S = {block} rows per block, but request {ids[k]!r} has {int(scheduled[k])} logits rows",
            request=int(listed[k]),
            rank=rank,
        )


def table_owners(owner_table, slots: np.ndarray, max_num_reqs: int, tp: int, rank) -> np.ndarray:
    """[N] the owners the step's owner table gives the batch's slots (owner rule owner_table, INV-OWNER),
    after PRE-OWNER-TABLE and PRE-OWNER-TABLE-RANGE: only the batch's entries are read (CL-OWNER-TABLE).
    ``slots`` are in range (checked before)."""
    if owner_table is None:
        _fail("PRE-OWNER-TABLE", "owner_table", "no owner table was passed", rank=rank)
    if not isinstance(owner_table, np.ndarray) or not np.issubdtype(owner_table.dtype, np.integer):
        dtype = getattr(owner_table, "dtype", None)
        _fail(
            "PRE-OWNER-TABLE",
            "owner_table",
            f"{type(owner_table).__name__} of dtype {dtype} is not a numpy integer array",
            rank=rank,
        )
    if owner_table.shape != (max_num_reqs,):
        _fail(
            "PRE-OWNER-TABLE",
            "owner_table",
            f"shape {owner_table.shape}, expected ({max_num_reqs},): one entry per slot",
            rank=rank,
        )
    owners = owner_table[slots]
    outside = (owners < 0) | (owners >= tp)
    if outside.any():
        bad = int(np.flatnonzero(outside)[0])
        _fail(
            "PRE-OWNER-TABLE-RANGE",
            "owner_table",
            f"the owner of slot {int(slots[bad])} is {int(owners[bad])}, outside [0, {tp})",
            request=bad,
            rank=rank,
        )
    return owners.astype(np.intp, copy=False)
