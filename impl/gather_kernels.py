"""The gather's Triton kernels: the send buffers packed on the owner, the gathered rows unpacked.

* ``pack_kernel``: the rank's sampled ids, counts, NaN sums and logprobs into the all-gather send
  buffers (the spec's wire layout, padding rows included).
* ``unpack_kernel``: the gathered buffers back into batch order.
"""

from __future__ import annotations

import triton
import triton.language as tl

from shardspec.impl.kernels import request_rows


@triton.jit(
    do_not_specialize=[
        "ids_stride0",
        "ids_stride1",
        "ids_width",
        "sampled_stride",
        "rejected_stride",
        "nans_stride",
        "lp_ids_stride0",
        "lp_ids_stride1",
        "lp_vals_stride0",
        "lp_vals_stride1",
        "lp_width",
        "lp_ranks_stride",
        "local_cu_stride",
        "nans_len",
        "lp_len",
        "num_local_reqs",
        "max_reqs_per_rank",
        "width",
        "sampled_cols",
        "num_cols",
    ],
    do_not_specialize_on_alignment=[
        "local_cu_ptr",
        "ids_ptr",
        "sampled_ptr",
        "rejected_ptr",
        "nans_ptr",
        "lp_ids_ptr",
        "lp_vals_ptr",
        "lp_ranks_ptr",
    ],
)
def pack_kernel(
    send_ptr,
    local_cu_ptr,
    local_cu_stride,
    ids_ptr,
    ids_stride0,
    ids_stride1,
    ids_width,
    sampled_ptr,
    sampled_stride,
    rejected_ptr,
    rejected_stride,
    nans_ptr,
    nans_stride,
    lp_send_ids_ptr,
    lp_send_vals_ptr,
    lp_ids_ptr,
    lp_ids_stride0,
    lp_ids_stride1,
    lp_vals_ptr,
    lp_vals_stride0,
    lp_vals_stride1,
    lp_width,
    lp_ranks_ptr,
    lp_ranks_stride,
    nans_len,
    lp_len,
    num_local_reqs,
    max_reqs_per_rank,
    width,
    sampled_cols,
    num_cols,
    HAS_OUTPUT: tl.constexpr,
    HAS_NANS: tl.constexpr,
    HAS_LOGPROBS: tl.constexpr,
    LOCAL_LOGPROBS: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS_PAD: tl.constexpr,
    SAMPLED_PAD: tl.constexpr,
    COLS_PAD: tl.constexpr,
):
    """Send row j < max_reqs_per_rank: local request j, or zeros past the local requests.

    Every input is read by its strides. Rows found through the local prefix sum are masked to the
    lengths of the tensors read (nans_len; lp_len for the three logprob tensors), so a prefix sum
    that disagrees with them never reads outside them; writes stay inside the send buffers."""
    reqs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_wire = reqs < max_reqs_per_rank
    cols = tl.arange(0, SAMPLED_PAD)
    row = tl.zeros([BLOCK, SAMPLED_PAD], dtype=tl.int64)
    if HAS_OUTPUT:
        has = reqs < num_local_reqs
        # Narrower local ids are zero-filled, wider ones truncated to width.
        copied = cols < tl.minimum(ids_width, width)
        ids_at = ids_ptr + reqs[:, None] * ids_stride0 + cols[None, :] * ids_stride1
        row = tl.load(ids_at, mask=has[:, None] & copied[None, :], other=0).to(tl.int64)
        num_sampled = tl.load(sampled_ptr + reqs * sampled_stride, mask=has, other=0).to(tl.int64)
        num_rejected = tl.load(rejected_ptr + reqs * rejected_stride, mask=has, other=0).to(tl.int64)
        row = tl.where(cols[None, :] == width, num_sampled[:, None], row)
        row = tl.where(cols[None, :] == width + 1, num_rejected[:, None], row)
        if HAS_NANS:
            first, counts = request_rows(local_cu_ptr, local_cu_stride, reqs, has)
            pos = tl.arange(0, ROWS_PAD)
            rows = first[:, None] + pos[None, :]
            readable = has[:, None] & (pos[None, :] < counts[:, None]) & (rows >= 0) & (rows < nans_len)
            nans = tl.load(nans_ptr + rows * nans_stride, mask=readable, other=0)
            row = tl.where(cols[None, :] == width + 2, tl.sum(nans.to(tl.int64), axis=1)[:, None], row)
    send_at = send_ptr + reqs[:, None] * sampled_cols + cols[None, :]
    tl.store(send_at, row, mask=in_wire[:, None] & (cols[None, :] < sampled_cols))
    if HAS_LOGPROBS:
        _pack_logprobs(
            local_cu_ptr,
            local_cu_stride,
            lp_send_ids_ptr,
            lp_send_vals_ptr,
            lp_ids_ptr,
            lp_ids_stride0,
            lp_ids_stride1,
            lp_vals_ptr,
            lp_vals_stride0,
            lp_vals_stride1,
            lp_width,
            lp_ranks_ptr,
            lp_ranks_stride,
            lp_len,
            num_local_reqs,
            max_reqs_per_rank,
            width,
            num_cols,
            LOCAL_LOGPROBS,
            BLOCK,
            ROWS_PAD,
            COLS_PAD,
        )


@triton.jit
def _pack_logprobs(
    local_cu_ptr,
    local_cu_stride,
    lp_send_ids_ptr,
    lp_send_vals_ptr,
    lp_ids_ptr,
    lp_ids_stride0,
    lp_ids_stride1,
    lp_vals_ptr,
    lp_vals_stride0,
    lp_vals_stride1,
    lp_width,
    lp_ranks_ptr,
    lp_ranks_stride,
    lp_len,
    num_local_reqs,
    max_reqs_per_rank,
    width,
    num_cols,
    LOCAL_LOGPROBS: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS_PAD: tl.constexpr,
    COLS_PAD: tl.constexpr,
):
    """Wire row j*width + p: local request j's p-th logits row, or id 0 / -inf / rank 0."""
    flat = tl.program_id(0) * BLOCK * ROWS_PAD + tl.arange(0, BLOCK * ROWS_PAD)
    reqs = flat // ROWS_PAD
    pos = flat % ROWS_PAD
    write = (reqs < max_reqs_per_rank) & (pos < width)
    wire_rows = (reqs * width + pos).to(tl.int64)
    cols = tl.arange(0, COLS_PAD)
    ids = tl.zeros([BLOCK * ROWS_PAD, COLS_PAD], dtype=tl.int64)
    vals = tl.full([BLOCK * ROWS_PAD, COLS_PAD], float("-inf"), dtype=tl.float32)
    if LOCAL_LOGPROBS:
        req_has = reqs < num_local_reqs
        first, counts = request_rows(local_cu_ptr, local_cu_stride, reqs, req_has)
        src = (first + pos).to(tl.int64)
        has = req_has & (pos < counts) & (src >= 0) & (src < lp_len)
        copied = has[:, None] & (cols[None, :] < tl.minimum(lp_width, num_cols))
        ids_at = lp_ids_ptr + src[:, None] * lp_ids_stride0 + cols[None, :] * lp_ids_stride1
        ids = tl.load(ids_at, mask=copied, other=0).to(tl.int64)
        selected = tl.load(lp_ranks_ptr + src * lp_ranks_stride, mask=has, other=0).to(tl.int64)
        ids = tl.where(cols[None, :] == num_cols, selected[:, None], ids)
        vals_at = lp_vals_ptr + src[:, None] * lp_vals_stride0 + cols[None, :] * lp_vals_stride1
        vals = tl.load(vals_at, mask=copied, other=float("-inf")).to(tl.float32)
    ids_mask = write[:, None] & (cols[None, :] < num_cols + 1)
    tl.store(lp_send_ids_ptr + wire_rows[:, None] * (num_cols + 1) + cols[None, :], ids, mask=ids_mask)
    vals_mask = write[:, None] & (cols[None, :] < num_cols)
    tl.store(lp_send_vals_ptr + wire_rows[:, None] * num_cols + cols[None, :], vals, mask=vals_mask)


@triton.jit(
    do_not_specialize=[
        "cu_stride",
        "cu_len",
        "num_reqs",
        "num_logits",
        "num_src_rows",
        "width",
        "sampled_cols",
        "num_cols",
    ],
    do_not_specialize_on_alignment=[
        "src_indices_ptr",
        "cu_ptr",
        "out_ids_ptr",
        "out_sampled_ptr",
        "out_rejected_ptr",
        "out_nans_ptr",
        "out_lp_ids_ptr",
        "out_lp_vals_ptr",
        "out_lp_ranks_ptr",
    ],
)
def unpack_kernel(
    gathered_ptr,
    src_indices_ptr,
    cu_ptr,
    cu_stride,
    cu_len,
    out_ids_ptr,
    out_sampled_ptr,
    out_rejected_ptr,
    out_nans_ptr,
    lp_gathered_ids_ptr,
    lp_gathered_vals_ptr,
    out_lp_ids_ptr,
    out_lp_vals_ptr,
    out_lp_ranks_ptr,
    num_reqs,
    num_logits,
    num_src_rows,
    width,
    sampled_cols,
    num_cols,
    HAS_NANS: tl.constexpr,
    HAS_LOGPROBS: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS_PAD: tl.constexpr,
    COLS_PAD: tl.constexpr,
):
    """Batch request i reads gathered row gathered_src_indices[i] (rank-major).

    The batch's prefix sum is read by its stride (cu_len entries). Gathered rows outside
    [0, num_src_rows) and output rows outside [0, num_logits) (the host copy's count) are never
    accessed, whatever the device values."""
    reqs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = reqs < num_reqs
    src = tl.load(src_indices_ptr + reqs, mask=valid, other=0)
    src_ok = valid & (src >= 0) & (src < num_src_rows)
    row_at = gathered_ptr + src * sampled_cols
    cols = tl.arange(0, ROWS_PAD)
    id_mask = valid[:, None] & (cols[None, :] < width)
    ids = tl.load(row_at[:, None] + cols[None, :], mask=id_mask & src_ok[:, None], other=0)
    tl.store(out_ids_ptr + reqs[:, None].to(tl.int64) * width + cols[None, :], ids, mask=id_mask)
    num_sampled = tl.load(row_at + width, mask=src_ok, other=0)
    tl.store(out_sampled_ptr + reqs, num_sampled.to(tl.int32), mask=valid)
    num_rejected = tl.load(row_at + width + 1, mask=src_ok, other=0)
    tl.store(out_rejected_ptr + reqs, num_rejected.to(tl.int32), mask=valid)
    if HAS_NANS:
        nans = tl.load(row_at + width + 2, mask=src_ok, other=0)
        tl.store(out_nans_ptr + reqs, nans.to(tl.int32), mask=valid)
    if HAS_LOGPROBS:
        flat = tl.program_id(0) * BLOCK * ROWS_PAD + tl.arange(0, BLOCK * ROWS_PAD)
        row_reqs = flat // ROWS_PAD
        pos = flat % ROWS_PAD
        req_valid = (row_reqs < num_reqs) & (row_reqs + 1 < cu_len)
        first, counts = request_rows(cu_ptr, cu_stride, row_reqs, req_valid)
        out_rows = (first + pos).to(tl.int64)
        row_src = tl.load(src_indices_ptr + row_reqs, mask=req_valid, other=0)
        has = (
            req_valid
            & (pos < counts)
            & (pos < width)
            & (out_rows >= 0)
            & (out_rows < num_logits)
            & (row_src >= 0)
            & (row_src < num_src_rows)
        )
        src_rows = row_src * width + pos
        lp_cols = tl.arange(0, COLS_PAD)
        copied = has[:, None] & (lp_cols[None, :] < num_cols)
        lp_ids = tl.load(lp_gathered_ids_ptr + src_rows[:, None] * (num_cols + 1) + lp_cols[None, :], mask=copied)
        tl.store(out_lp_ids_ptr + out_rows[:, None] * num_cols + lp_cols[None, :], lp_ids, mask=copied)
        selected = tl.load(lp_gathered_ids_ptr + src_rows * (num_cols + 1) + num_cols, mask=has)
        tl.store(out_lp_ranks_ptr + out_rows, selected, mask=has)
        lp_vals = tl.load(lp_gathered_vals_ptr + src_rows[:, None] * num_cols + lp_cols[None, :], mask=copied)
        tl.store(out_lp_vals_ptr + out_rows[:, None] * num_cols + lp_cols[None, :], lp_vals, mask=copied)
