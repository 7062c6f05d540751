"""Precondition checks of the batch and the grammar output, all before any kernel runs (those of the
local sampler output and the logits shard are in ``output_checks.py``).

They read host copies and tensor metadata (shape, dtype). The values of the two
device copies the plan kernel reads (idx_mapping, cu_num_logits) are compared
with their host copies (PRE-HOST-DEVICE-MATCH) where that is free, the device
copies living in host memory, and on a GPU only when asked: there it costs a
device-to-host copy and a wait every step. Not checked, since that needs device
values: PRE-LOGITS-TAIL, PRE-EXPANDED and the values of query_start_loc. The
kernels mask every row index they make from device values to the host's counts,
so unchecked device values can make a result wrong but never an access out of
bounds.
PRE-REQ-IDS-UNIQUE is checked where the ids are indexed anyway (with a grammar
output). The order of the checks follows the reference's, so a batch that
breaks several preconditions names the same one. ``rules`` (a profile's; None: the
default profile's) pick the checks its rules add (``profile_checks.py`` holds them).

:func:`check_guards` is the part kept with the checks switched off: capacity,
slot range (INV-REJECT-INVALID) and the shapes of what the kernels read.
"""

from __future__ import annotations

import numpy as np
import torch

from shardspec.impl import profile_checks
from shardspec.impl.profiles import admitted_rows
from shardspec.spec.errors import PreconditionError
from shardspec.spec.model import GrammarOutput, InputBatch
from shardspec.spec.profiles import default_rules
from shardspec.spec.rules import Rules

_INT_DTYPES = (torch.int32, torch.int64)


def _fail(pid: str, field: str, message: str, request=None, rank=None) -> None:
    raise PreconditionError(pid, field, message, request=request, rank=rank)


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def check_construction(rules, tp_size: int, max_num_reqs: int, rank) -> None:
    """PRE-TP-SIZE, PRE-CAPACITY-TP: the construction rule's group and capacity, before the workspace."""
    if not rules.sharded_groups_only:
        return
    if tp_size < rules.min_tp:
        _fail(
            "PRE-TP-SIZE",
            "tp_size",
            f"tp={tp_size}: {rules.profile} needs a group of {rules.min_tp} or more",
            rank=rank,
        )
    if max_num_reqs < rules.min_capacity(tp_size):
        _fail(
            "PRE-CAPACITY-TP",
            "max_num_reqs",
            f"capacity {max_num_reqs} < tp={tp_size}: a rank would never own a request",
            rank=rank,
        )


def check_capacity_reqs(num_reqs: int, max_num_reqs: int, rank) -> None:
    """Always on: buffers are sized by the capacity, so nothing beyond it may pass."""
    if num_reqs > max_num_reqs:
        _fail(
            "PRE-CAPACITY-REQS",
            "num_reqs",
            f"{num_reqs} requests exceed the sharder's capacity max_num_reqs={max_num_reqs}",
            rank=rank,
        )


def check_capacity_logits(width: int, counts: np.ndarray, max_num_logits_per_req: int, rank) -> None:
    """Always on, like :func:`check_capacity_reqs`; ``width`` is the largest count."""
    if width > max_num_logits_per_req:
        bad = _first(counts > max_num_logits_per_req)
        _fail(
            "PRE-CAPACITY-LOGITS",
            "cu_num_logits",
            f"request has {counts[bad]} logits rows, more than the sharder's capacity "
            f"max_num_logits_per_req={max_num_logits_per_req}",
            request=bad,
            rank=rank,
        )


def cu_counts(batch: InputBatch, rank) -> tuple[np.ndarray, np.ndarray]:
    """(cu_num_logits_np, n_i per request); PRE-CU-LOGITS on the way."""
    cu = batch.cu_num_logits_np
    if cu.shape != (batch.num_reqs + 1,):
        _fail("PRE-CU-LOGITS", "cu_num_logits_np", f"shape {cu.shape}, expected ({batch.num_reqs + 1},)", rank=rank)
    if cu[0] != 0:
        _fail("PRE-CU-LOGITS", "cu_num_logits_np", f"starts at {int(cu[0])}, not 0", rank=rank)
    return cu, np.subtract(cu[1:], cu[:-1])


def largest_count(counts: np.ndarray, num_logits: int) -> int:
    """The agreed width W: the largest n_i, or 1 for an empty batch.

    Where every n_i >= 1 (checked, or promised by the caller), n_i summing to N means all are 1,
    which spares the reduction in the common one-row-per-request step.
    """
    if num_logits == counts.shape[0]:
        return 1
    return int(np.maximum.reduce(counts))


def check_guards(
    batch: InputBatch,
    *,
    max_num_reqs: int,
    max_num_logits_per_req: int,
    rank=None,
    rules: Rules | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """The checks that stay on without the others; returns :func:`cu_counts` and the width W, of the
    admitted rows where vllm-0.33's admitted counts are given (which are then checked, PRE-DRAFTS).

    Buffers are sized by the capacity and slots index per-slot state, so neither may be exceeded
    (INV-REJECT-INVALID); the kernels read the device fields up to the host's counts, so their
    shapes must match. The largest count is taken as it is, since nothing here promises n_i >= 1.
    """
    check_capacity_reqs(batch.num_reqs, max_num_reqs, rank)
    check_slot_range(batch.idx_mapping_np, max_num_reqs, rank)
    cu, counts = cu_counts(batch, rank)
    width = int(np.maximum.reduce(counts)) if batch.num_reqs else 1
    check_capacity_logits(width, counts, max_num_logits_per_req, rank)
    if (rules or default_rules()).admits_drafts and batch.num_admitted_draft_tokens is not None:
        profile_checks.check_admitted_drafts(batch, rank)
        cu, counts = admitted_rows(batch, counts)
        width = int(np.maximum.reduce(counts)) if batch.num_reqs else 1
    num_reqs, num_logits = batch.num_reqs, int(cu[-1])
    _check_device_shape("PRE-HOST-DEVICE-MATCH", "idx_mapping", batch.idx_mapping, (num_reqs,), rank)
    _check_device_shape("PRE-HOST-DEVICE-MATCH", "cu_num_logits", batch.cu_num_logits, cu.shape, rank)
    _check_device_shape("PRE-FIELD-SHAPES", "seq_lens", batch.seq_lens, (num_reqs,), rank)
    _check_device_shape("PRE-FIELD-SHAPES", "logits_indices", batch.logits_indices, (num_logits,), rank)
    return cu, counts, width


def check_slot_range(slots: np.ndarray, max_num_reqs: int, rank) -> None:
    """PRE-DTYPES of the host slots, then PRE-SLOT-RANGE: one reduction, no allocation by slot value."""
    if slots.dtype.kind not in ("i", "u"):
        _fail("PRE-DTYPES", "idx_mapping_np", f"dtype {slots.dtype} is not an integer type", rank=rank)
    if slots.shape[0]:
        # Read as unsigned, a negative slot is larger than any capacity: one maximum finds both kinds.
        unsigned = slots.view(np.dtype(f"u{slots.dtype.itemsize}"))
        if np.maximum.reduce(unsigned) >= max_num_reqs:
            bad = _first((slots < 0) | (slots >= max_num_reqs))
            _fail(
                "PRE-SLOT-RANGE",
                "idx_mapping",
                f"slot {slots[bad]} is outside [0, {max_num_reqs})",
                request=bad,
                rank=rank,
            )


def check_input_batch(
    batch: InputBatch,
    *,
    max_num_reqs: int,
    max_num_logits_per_req: int,
    rank=None,
    compare_device_copies: bool | None = None,
    rules: Rules | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Every check of the batch; returns :func:`cu_counts` and the width W of the rows the device
    fields lay out: in vllm-0.33 with admitted counts, the admitted rows (CL-ADMITTED-DRAFTS).

    ``compare_device_copies``: compare the values of the device copies with the host copies; None
    does so where the device copies are in host memory (no wait).
    """
    num_reqs = batch.num_reqs
    slots = batch.idx_mapping_np
    if len(batch.req_ids) != num_reqs or slots.shape != (num_reqs,):
        _fail(
            "PRE-BATCH-SIZE",
            "num_reqs",
            f"num_reqs={num_reqs} but {len(batch.req_ids)} req_ids and idx_mapping_np of shape {tuple(slots.shape)}",
            rank=rank,
        )
    check_capacity_reqs(num_reqs, max_num_reqs, rank)
    device_cu = _check_slots(batch, max_num_reqs, rank, compare_device_copies)
    cu, counts = cu_counts(batch, rank)
    if num_reqs and np.minimum.reduce(counts) < 1:
        bad = _first(counts < 1)
        _fail(
            "PRE-LOGITS-PER-REQ",
            "cu_num_logits",
            f"request has {counts[bad]} logits rows; at least 1 is required",
            request=bad,
            rank=rank,
        )
    num_logits = int(cu[-1])
    width = largest_count(counts, num_logits)
    check_capacity_logits(width, counts, max_num_logits_per_req, rank)
    scheduled, scheduled_width, admitted = counts, width, None
    rules = rules or default_rules()
    if rules.admits_drafts:
        profile_checks.check_admitted_drafts(batch, rank)
        admitted = batch.num_admitted_draft_tokens
    if rules.has_upper_bound:
        profile_checks.check_seq_lens_upper_bound(batch, rank, required=rules.upper_bound_required)
    if admitted is not None:
        cu, counts = admitted_rows(batch, scheduled)
        num_logits = int(cu[-1])
        width = largest_count(counts, num_logits)
    if batch.cu_num_logits.dtype not in _INT_DTYPES:
        _fail("PRE-DTYPES", "cu_num_logits", f"dtype {batch.cu_num_logits.dtype} is not int32/int64", rank=rank)
    _check_device_shape("PRE-HOST-DEVICE-MATCH", "cu_num_logits", batch.cu_num_logits, cu.shape, rank)
    if device_cu is not None:
        host_name = "cu_num_logits_np" if admitted is None else "the admitted rows' prefix sums"
        _check_match("cu_num_logits", device_cu, cu, rank, host_name=host_name)
    _check_shapes(batch, num_logits, rank)
    _check_drafts(batch, scheduled, scheduled_width, rank, admitted)
    return cu, counts, width


def _check_slots(batch: InputBatch, max_num_reqs: int, rank, compare: bool | None) -> np.ndarray | None:
    """Host slots, then the device copy; returns the values of the device copy of cu_num_logits, read
    in the same wait, or None where they are not compared (or its dtype is not an integer one, which
    PRE-DTYPES rejects before any comparison)."""
    slots = batch.idx_mapping_np
    check_slot_range(slots, max_num_reqs, rank)
    if slots.shape[0]:
        # In range, so the histogram has max_num_reqs bins; a shared slot is counted twice.
        histogram = np.bincount(slots.astype(np.intp, copy=False), minlength=max_num_reqs)
        if np.count_nonzero(histogram) != slots.shape[0]:
            _, first_seen = np.unique(slots, return_index=True)
            repeated = np.setdiff1d(np.arange(slots.shape[0]), first_seen)
            _fail("PRE-SLOT-UNIQUE", "idx_mapping", "two requests share a slot", request=int(repeated.min()), rank=rank)
    if batch.idx_mapping.dtype not in _INT_DTYPES:
        _fail("PRE-DTYPES", "idx_mapping", f"dtype {batch.idx_mapping.dtype} is not int32/int64", rank=rank)
    _check_device_shape("PRE-HOST-DEVICE-MATCH", "idx_mapping", batch.idx_mapping, slots.shape, rank)
    cu = batch.cu_num_logits
    if compare is None:
        compare = batch.idx_mapping.device.type == "cpu" and cu.device.type == "cpu"
    if not compare:
        return None
    # Both device copies in one wait; cu_num_logits only where its dtype is checked to be readable.
    device_slots, *device_cu = host_values(batch.idx_mapping, *((cu,) if cu.dtype in _INT_DTYPES else ()))
    _check_match("idx_mapping", device_slots, slots, rank, per_request=True)
    return device_cu[0] if device_cu else None


def host_values(*tensors: torch.Tensor) -> list[np.ndarray]:
    """The tensors' values as numpy arrays: views of tensors in host memory (strides kept), else
    copies that wait once for the device."""
    if all(t.device.type == "cpu" for t in tensors):
        return [t.numpy() for t in tensors]
    copies = [t.to("cpu", non_blocking=True) for t in tensors]
    for device in {t.device for t in tensors if t.device.type == "cuda"}:
        torch.cuda.current_stream(device).synchronize()
    return [c.numpy() for c in copies]


def _check_device_shape(pid: str, name: str, tensor: torch.Tensor, shape: tuple, rank) -> None:
    if tensor.shape != shape:
        _fail(pid, name, f"device copy has shape {tuple(tensor.shape)}, the host copy {tuple(shape)}", rank=rank)


def _check_match(
    name: str, device: np.ndarray, host: np.ndarray, rank, *, per_request: bool = False, host_name: str | None = None
) -> None:
    """PRE-HOST-DEVICE-MATCH on values (shapes are equal); names the request for idx_mapping."""
    differs = np.not_equal(device, host)
    if np.logical_or.reduce(differs):
        bad = _first(differs)
        _fail(
            "PRE-HOST-DEVICE-MATCH",
            name,
            f"device copy differs from {host_name or name + '_np'} at entry {bad}: {device[bad]} != {host[bad]}",
            request=bad if per_request else None,
            rank=rank,
        )


def _check_shapes(batch: InputBatch, num_logits: int, rank) -> None:
    """Shapes of the device fields the kernels read (metadata only)."""
    num_reqs = batch.num_reqs
    if batch.query_start_loc.shape != (num_reqs + 1,):
        _fail(
            "PRE-QUERY-START-LOC",
            "query_start_loc",
            f"shape {tuple(batch.query_start_loc.shape)} is not ({num_reqs + 1},)",
            rank=rank,
        )
    for name, length in (
        ("seq_lens", num_reqs),
        ("logits_indices", num_logits),
        ("expanded_idx_mapping", num_logits),
        ("expanded_local_pos", num_logits),
    ):
        actual = getattr(batch, name).shape
        if actual != (length,):
            _fail("PRE-FIELD-SHAPES", name, f"shape {tuple(actual)}, expected ({length},)", rank=rank)


def _check_drafts(batch: InputBatch, counts: np.ndarray, width: int, rank, admitted=None) -> None:
    """``counts`` and ``width``: the scheduled rows; ``admitted``: vllm-0.33's admitted counts, which
    num_draft_tokens then sums (checked by ``profile_checks.check_admitted_drafts``), or None."""
    drafts = batch.num_draft_tokens_per_req
    if drafts is None:
        if width != 1:
            _fail(
                "PRE-DRAFTS",
                "num_draft_tokens_per_req",
                "is None, so every request must have exactly 1 logits row",
                request=_first(counts != 1),
                rank=rank,
            )
        if batch.num_draft_tokens != 0:
            _fail(
                "PRE-DRAFTS",
                "num_draft_tokens",
                f"is {batch.num_draft_tokens} without num_draft_tokens_per_req",
                rank=rank,
            )
        return
    drafts = np.asarray(drafts)
    if drafts.dtype.kind not in ("i", "u"):
        _fail("PRE-DTYPES", "num_draft_tokens_per_req", f"dtype {drafts.dtype} is not an integer type", rank=rank)
    if drafts.shape != (batch.num_reqs,):
        _fail(
            "PRE-DRAFTS", "num_draft_tokens_per_req", f"shape {drafts.shape}, expected ({batch.num_reqs},)", rank=rank
        )
    mismatch = counts != drafts + 1
    if np.logical_or.reduce(mismatch):
        _fail(
            "PRE-DRAFTS",
            "num_draft_tokens_per_req",
            "a request's logits rows must be 1 + its draft tokens",
            request=_first(mismatch),
            rank=rank,
        )
    if admitted is None:
        total, name = int(np.add.reduce(drafts)), "num_draft_tokens_per_req"
    else:
        total, name = int(np.add.reduce(np.asarray(admitted))), "num_admitted_draft_tokens"
    if batch.num_draft_tokens != total:
        _fail("PRE-DRAFTS", "num_draft_tokens", f"is {batch.num_draft_tokens}, but {name} sums to {total}", rank=rank)


def _first_repeat(items: list) -> int:
    seen: set = set()
    return next(k for k, item in enumerate(items) if item in seen or seen.add(item))


def check_grammar_output(
    grammar: GrammarOutput,
    batch: InputBatch,
    position: dict,
    counts: np.ndarray,
    rank,
    rules: Rules | None = None,
) -> None:
    """``position`` maps request id to batch position (built by the caller); ``counts`` are the
    scheduled rows per request (vllm-seed's bitmask has a row for each)."""
    if len(position) != batch.num_reqs:
        _fail(
            "PRE-REQ-IDS-UNIQUE",
            "req_ids",
            "request ids are not unique",
            request=_first_repeat(batch.req_ids),
            rank=rank,
        )
    ids = grammar.structured_output_request_ids
    for k, req_id in enumerate(ids):
        if req_id not in position:
            _fail(
                "PRE-GRAMMAR-IDS",
                "structured_output_request_ids",
                f"entry {k} ({req_id!r}) is not in the batch",
                rank=rank,
            )
    if len(set(ids)) != len(ids):
        dup = _first_repeat(ids)
        _fail(
            "PRE-GRAMMAR-IDS",
            "structured_output_request_ids",
            f"entry {dup} repeats a request id",
            request=position[ids[dup]],
            rank=rank,
        )
    if (rules or default_rules()).grammar_blocks:
        profile_checks.check_grammar_blocks(grammar, batch, position, rank)
        return
    rows = int(counts[[position[r] for r in ids]].sum())  # no ids: an empty pick, which sums to 0
    bitmask = grammar.grammar_bitmask
    if bitmask.dim() != 2 or bitmask.shape[0] != rows:
        _fail(
            "PRE-GRAMMAR-BITMASK",
            "grammar_bitmask",
            f"shape {tuple(bitmask.shape)}; expected {rows} rows (one per logits row of the listed requests)",
            rank=rank,
        )
