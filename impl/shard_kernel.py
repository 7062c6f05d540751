"""The shard's Triton kernel: the plan and the local batch's device fields in one launch.

``shard_plan_kernel`` reads the batch's device copies (slots, prefix sum, logits indices, sequence
lengths) by their strides and writes the owner-sorted logits indices, the gathered source indices
and every device field of this rank's local batch. Each program counts, per rank, the requests and
rows before its block (``_count_block``), so no separate prefix-sum launch is needed.
"""

from __future__ import annotations

import triton
import triton.language as tl

from shardspec.impl.kernels import request_rows


@triton.jit
def _count_block(
    reqs_before,
    rows_before,
    rows_total,
    slots_ptr,
    slots_stride,
    cu_ptr,
    cu_stride,
    start,
    block_start,
    num_reqs,
    TP: tl.constexpr,
    TP_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    BY_POSITION: tl.constexpr,
    owners_ptr,
    HOST_OWNERS: tl.constexpr,
):
    """Per rank: requests before block_start, rows before it, rows in all; requests [start, start + BLOCK) added."""
    reqs = start + tl.arange(0, BLOCK)
    valid = reqs < num_reqs
    if HOST_OWNERS:
        owners = tl.load(owners_ptr + reqs, mask=valid, other=0)
    elif BY_POSITION:
        owners = reqs % TP
    else:
        owners = tl.load(slots_ptr + reqs * slots_stride, mask=valid, other=0) % TP
    _, counts = request_rows(cu_ptr, cu_stride, reqs, valid)
    owned = (owners[:, None] == tl.arange(0, TP_PAD)[None, :]) & valid[:, None]
    reqs_per_rank = tl.sum(owned.to(tl.int32), axis=0)
    rows_per_rank = tl.sum(tl.where(owned, counts[:, None], 0), axis=0)
    earlier = start < block_start
    return (
        reqs_before + tl.where(earlier, reqs_per_rank, 0),
        rows_before + tl.where(earlier, rows_per_rank, 0),
        rows_total + rows_per_rank,
    )


@triton.jit(
    do_not_specialize=[
        "slots_stride",
        "cu_stride",
        "logits_indices_stride",
        "seq_lens_stride",
        "num_reqs",
        "num_logits",
        "num_local_reqs",
        "num_local_logits",
        "max_reqs_per_rank",
    ],
    do_not_specialize_on_alignment=["slots_ptr", "cu_ptr", "logits_indices_ptr", "seq_lens_ptr"],
)
def shard_plan_kernel(
    slots_ptr,
    slots_stride,
    cu_ptr,
    cu_stride,
    logits_indices_ptr,
    logits_indices_stride,
    seq_lens_ptr,
    seq_lens_stride,
    sorted_indices_ptr,
    src_indices_ptr,
    local_slots_ptr,
    local_cu_ptr,
    local_indices_ptr,
    local_row_slots_ptr,
    local_row_pos_ptr,
    local_seq_lens_ptr,
    owners_ptr,
    num_reqs,
    num_logits,
    num_local_reqs,
    num_local_logits,
    max_reqs_per_rank,
    TP: tl.constexpr,
    RANK: tl.constexpr,
    TP_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS_PAD: tl.constexpr,
    LOOP_END: tl.constexpr,
    BY_POSITION: tl.constexpr = False,
    HOST_OWNERS: tl.constexpr = False,
):
    """Inputs are read by their strides (element units). The counts (num_*) come from the host copies,
    which the host has checked: every index made from device values is masked to the host's count of
    what it indexes, so device copies that disagree with the host copies give a wrong plan but never
    an access outside the step's part of the buffers.

    LOOP_END, if not 0, stands for num_reqs as the count loop's bound: the interpreter gets
    num_reqs so (a constexpr costs it nothing), since in Triton 3.6 with numpy >= 2.5 it fails on a
    loop bound that is, or was ever assigned from, a runtime value. Compiled kernels get 0 and the
    runtime bound, so no batch size recompiles.

    BY_POSITION: the owner of the request at batch position i is i mod TP (owner rule position_mod_tp),
    else its slot mod TP (slot_mod_tp); HOST_OWNERS: owners_ptr[i], the owners the host found (owner rules
    owner_table, whose table only the host holds and a slot read back from the device could not index
    safely, and contiguous_ranges); INV-OWNER."""
    block_start = tl.program_id(0) * BLOCK
    ranks = tl.arange(0, TP_PAD)
    # Per-rank request and row counts: before this block, and over the batch.
    reqs_before = tl.zeros([TP_PAD], dtype=tl.int32)
    rows_before = tl.zeros([TP_PAD], dtype=tl.int32)
    rows_total = tl.zeros([TP_PAD], dtype=tl.int32)
    if LOOP_END > 0:
        for start in range(0, LOOP_END, BLOCK):
            reqs_before, rows_before, rows_total = _count_block(
                reqs_before,
                rows_before,
                rows_total,
                slots_ptr,
                slots_stride,
                cu_ptr,
                cu_stride,
                start,
                block_start,
                num_reqs,
                TP,
                TP_PAD,
                BLOCK,
                BY_POSITION,
                owners_ptr,
                HOST_OWNERS,
            )
    else:
        for start in range(0, num_reqs, BLOCK):
            reqs_before, rows_before, rows_total = _count_block(
                reqs_before,
                rows_before,
                rows_total,
                slots_ptr,
                slots_stride,
                cu_ptr,
                cu_stride,
                start,
                block_start,
                num_reqs,
                TP,
                TP_PAD,
                BLOCK,
                BY_POSITION,
                owners_ptr,
                HOST_OWNERS,
            )
    # Rank r's rows start after every row of lower ranks (owner-sorted order).
    rank_row_start = tl.cumsum(rows_total, axis=0) - rows_total

    reqs = block_start + tl.arange(0, BLOCK)
    valid = reqs < num_reqs
    slots = tl.load(slots_ptr + reqs * slots_stride, mask=valid, other=0)
    if HOST_OWNERS:
        owners = tl.load(owners_ptr + reqs, mask=valid, other=0)
    elif BY_POSITION:
        owners = reqs % TP
    else:
        owners = slots % TP
    first, counts = request_rows(cu_ptr, cu_stride, reqs, valid)
    owned = (owners[:, None] == ranks[None, :]) & valid[:, None]
    owned_int = owned.to(tl.int32)
    # Inclusive prefix counts per owner inside the block; a request reads its
    # owner's column, shifted by the earlier blocks' counts.
    reqs_incl = tl.cumsum(owned_int, axis=0)
    rows_incl = tl.cumsum(owned_int * counts[:, None], axis=0)
    index_in_owner = tl.sum(tl.where(owned, reqs_incl - 1 + reqs_before[None, :], 0), axis=1)
    sorted_start = tl.sum(
        tl.where(owned, rows_incl - counts[:, None] + rows_before[None, :] + rank_row_start[None, :], 0), axis=1
    )
    tl.store(src_indices_ptr + reqs, owners.to(tl.int64) * max_reqs_per_rank + index_in_owner, mask=valid)

    pos = tl.arange(0, ROWS_PAD)
    row_valid = valid[:, None] & (pos[None, :] < counts[:, None])
    rows = first[:, None] + pos[None, :]
    readable = row_valid & (rows >= 0) & (rows < num_logits)
    indices = tl.load(logits_indices_ptr + rows.to(tl.int64) * logits_indices_stride, mask=readable, other=0).to(
        tl.int64
    )
    sorted_rows = sorted_start[:, None] + pos[None, :]
    in_range = row_valid & (sorted_rows >= 0) & (sorted_rows < num_logits)
    tl.store(sorted_indices_ptr + sorted_rows, indices, mask=in_range)

    # This rank's requests: local fields at their index among the owned ones.
    local_start = tl.sum(tl.where(ranks == RANK, rank_row_start, 0), axis=0)
    mine = valid & (owners == RANK)
    local_first = sorted_start - local_start
    # The request bound masks the per-request stores only; rows have their own bound. index_in_owner
    # in the row mask made Triton 3.6 compute its scan a second time in a layout that replicates the
    # [BLOCK, 1] tensor of one rank over 4 lanes, and that kernel left local rows unwritten on an H200.
    # Every local field is stored in its region's dtype: int32 (vllm-seed), or the batch field's
    # (vllm-0.33, CL-LOCAL-DTYPES; the caller picks int32 or int64 regions).
    mine_in_view = mine & (index_in_owner < num_local_reqs)
    tl.store(local_slots_ptr + index_in_owner, slots.to(local_slots_ptr.dtype.element_ty), mask=mine_in_view)
    seq_lens = tl.load(seq_lens_ptr + reqs * seq_lens_stride, mask=mine_in_view, other=0)
    tl.store(local_seq_lens_ptr + index_in_owner, seq_lens.to(local_seq_lens_ptr.dtype.element_ty), mask=mine_in_view)
    local_cu = (local_first + counts).to(local_cu_ptr.dtype.element_ty)
    tl.store(local_cu_ptr + index_in_owner + 1, local_cu, mask=mine_in_view)
    local_rows = local_first[:, None] + pos[None, :]
    row_mine = row_valid & mine[:, None] & (local_rows >= 0) & (local_rows < num_local_logits)
    tl.store(local_indices_ptr + local_rows, indices, mask=row_mine)
    row_slots = tl.broadcast_to(slots.to(local_row_slots_ptr.dtype.element_ty)[:, None], [BLOCK, ROWS_PAD])
    tl.store(local_row_slots_ptr + local_rows, row_slots, mask=row_mine)
    row_pos = tl.broadcast_to(pos.to(local_row_pos_ptr.dtype.element_ty)[None, :], [BLOCK, ROWS_PAD])
    tl.store(local_row_pos_ptr + local_rows, row_pos, mask=row_mine)
