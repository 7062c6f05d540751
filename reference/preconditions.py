"""Precondition checks of what ``shard_sampler_inputs`` takes: the input batch and the grammar output.

Each violation raises :class:`PreconditionError` naming the precondition ID,
the field and, where one is at fault, the request's batch position. The
checks read host copies and, once per step, the device copies they must
match: cheap next to sampling, and they can be switched off. The checks of
what the engine produces later in the step are in
:mod:`shardspec.reference.output_preconditions`.
"""

from __future__ import annotations

import numpy as np

from shardspec.reference import profile_rules
from shardspec.reference.violations import INT_DTYPES, check_shape, duplicate_position, first_bad, require
from shardspec.spec.errors import PreconditionError
from shardspec.spec.model import GrammarOutput, InputBatch
from shardspec.spec.profiles import default_rules
from shardspec.spec.rules import Rules


def check_construction(rules, tp_size: int, max_num_reqs: int, rank=None) -> None:
    """PRE-TP-SIZE and PRE-CAPACITY-TP: the group and capacity a sharder is built for (``construction``)."""
    if not rules.sharded_groups_only:
        return
    require(
        tp_size >= rules.min_tp,
        "PRE-TP-SIZE",
        "tp_size",
        f"a group of {tp_size}: profile {rules.profile} shards a batch over at least {rules.min_tp} ranks",
        rank=rank,
    )
    least = rules.min_capacity(tp_size)
    require(
        max_num_reqs >= least,
        "PRE-CAPACITY-TP",
        "max_num_reqs",
        f"max_num_reqs={max_num_reqs} is below the group's {tp_size} ranks: some rank would own no request in any step",
        rank=rank,
    )


def check_input_batch(
    batch: InputBatch,
    *,
    max_num_reqs: int,
    max_num_logits_per_req: int,
    rank=None,
    rules: Rules | None = None,
) -> None:
    """The batch's preconditions under ``rules`` (None: the default profile's)."""
    num_reqs = batch.num_reqs
    require(
        len(batch.req_ids) == num_reqs and batch.idx_mapping_np.shape == (num_reqs,),
        "PRE-BATCH-SIZE",
        "num_reqs",
        f"num_reqs={num_reqs} but {len(batch.req_ids)} req_ids and idx_mapping_np of shape "
        f"{tuple(batch.idx_mapping_np.shape)}",
        rank=rank,
    )
    require(
        num_reqs <= max_num_reqs,
        "PRE-CAPACITY-REQS",
        "num_reqs",
        f"{num_reqs} requests exceed the sharder's capacity max_num_reqs={max_num_reqs}",
        rank=rank,
    )
    _check_slots(batch, max_num_reqs, rank)
    counts = _check_cu_num_logits(batch, max_num_logits_per_req, rank)
    rules = rules or default_rules()
    if rules.admits_drafts:
        profile_rules.check_admitted_drafts(batch, rank)
    if rules.has_upper_bound:
        profile_rules.check_seq_lens_upper_bound(batch, rank, required=rules.upper_bound_required)
    _check_drafts(batch, counts, rank, rules)
    # The device fields lay out the admitted rows where admitted counts are given (CL-ADMITTED-DRAFTS).
    device_cu = profile_rules.device_cu_num_logits(batch, rules)
    _check_device_cu(batch, device_cu, rank)
    _check_token_layout(batch, device_cu, rank)
    # Last: its outcome is undefined, so a batch that also breaks a must-reject precondition
    # names that one (and a slot shared by two requests is not reported as a shared id).
    require(
        len(set(batch.req_ids)) == num_reqs,
        "PRE-REQ-IDS-UNIQUE",
        "req_ids",
        "request ids are not unique",
        request=duplicate_position(batch.req_ids),
        rank=rank,
    )


def _check_slots(batch: InputBatch, max_num_reqs: int, rank) -> None:
    slots = np.asarray(batch.idx_mapping_np)
    require(
        np.issubdtype(slots.dtype, np.integer),
        "PRE-DTYPES",
        "idx_mapping_np",
        f"dtype {slots.dtype} is not an integer type",
        rank=rank,
    )
    bad = first_bad((slots < 0) | (slots >= max_num_reqs))
    if bad is not None:
        raise PreconditionError(
            "PRE-SLOT-RANGE", "idx_mapping", f"slot {slots[bad]} is outside [0, {max_num_reqs})", request=bad, rank=rank
        )
    require(
        len(np.unique(slots)) == slots.shape[0],
        "PRE-SLOT-UNIQUE",
        "idx_mapping",
        "two requests share a slot",
        request=duplicate_position(slots.tolist()),
        rank=rank,
    )
    require(
        batch.idx_mapping.dtype in INT_DTYPES,
        "PRE-DTYPES",
        "idx_mapping",
        f"dtype {batch.idx_mapping.dtype} is not int32/int64",
        rank=rank,
    )
    device_slots = batch.idx_mapping.detach().cpu().numpy()
    require(
        device_slots.shape == slots.shape and np.array_equal(device_slots, slots),
        "PRE-HOST-DEVICE-MATCH",
        "idx_mapping",
        "device copy differs from idx_mapping_np",
        request=_first_mismatch(device_slots, slots),
        rank=rank,
    )


def _first_mismatch(a: np.ndarray, b: np.ndarray) -> int | None:
    if a.shape != b.shape:
        return None
    return first_bad(a != b)


def _check_cu_num_logits(batch: InputBatch, max_num_logits_per_req: int, rank) -> np.ndarray:
    """Checks cu_num_logits_np and returns its [N] int64 per-request counts."""
    num_reqs = batch.num_reqs
    cu = np.asarray(batch.cu_num_logits_np)
    require(
        cu.shape == (num_reqs + 1,),
        "PRE-CU-LOGITS",
        "cu_num_logits_np",
        f"shape {cu.shape}, expected ({num_reqs + 1},)",
        rank=rank,
    )
    require(int(cu[0]) == 0, "PRE-CU-LOGITS", "cu_num_logits_np", f"starts at {int(cu[0])}, not 0", rank=rank)
    counts = np.diff(cu.astype(np.int64))
    bad = first_bad(counts < 1)
    if bad is not None:
        raise PreconditionError(
            "PRE-LOGITS-PER-REQ",
            "cu_num_logits",
            f"request has {counts[bad]} logits rows; at least 1 is required",
            request=bad,
            rank=rank,
        )
    bad = first_bad(counts > max_num_logits_per_req)
    if bad is not None:
        raise PreconditionError(
            "PRE-CAPACITY-LOGITS",
            "cu_num_logits",
            f"request has {counts[bad]} logits rows, more than the "
            f"sharder's capacity max_num_logits_per_req={max_num_logits_per_req}",
            request=bad,
            rank=rank,
        )
    return counts


def _check_device_cu(batch: InputBatch, expected: np.ndarray, rank) -> None:
    require(
        batch.cu_num_logits.dtype in INT_DTYPES,
        "PRE-DTYPES",
        "cu_num_logits",
        f"dtype {batch.cu_num_logits.dtype} is not int32/int64",
        rank=rank,
    )
    device_cu = batch.cu_num_logits.detach().cpu().numpy()
    require(
        device_cu.shape == expected.shape and np.array_equal(device_cu, expected),
        "PRE-HOST-DEVICE-MATCH",
        "cu_num_logits",
        "device copy differs from cu_num_logits_np"
        + ("'s admitted rows" if batch.num_admitted_draft_tokens is not None else ""),
        rank=rank,
    )


def _check_token_layout(batch: InputBatch, cu: np.ndarray, rank) -> None:
    num_reqs, num_logits = batch.num_reqs, int(cu[-1])
    qsl = batch.query_start_loc.detach().cpu().numpy().astype(np.int64)
    require(
        qsl.shape == (num_reqs + 1,) and (num_reqs == 0 or qsl[0] == 0),
        "PRE-QUERY-START-LOC",
        "query_start_loc",
        f"shape {qsl.shape} or start {qsl[:1]} is not ({num_reqs + 1},) from 0",
        rank=rank,
    )
    counts = np.diff(cu)
    bad = first_bad(np.diff(qsl) < counts)
    require(
        bad is None,
        "PRE-QUERY-START-LOC",
        "query_start_loc",
        "query is shorter than the request's logits rows (or decreasing)",
        request=bad,
        rank=rank,
    )
    check_shape("PRE-FIELD-SHAPES", "seq_lens", batch.seq_lens, (num_reqs,), rank)
    for name in ("logits_indices", "expanded_idx_mapping", "expanded_local_pos"):
        check_shape("PRE-FIELD-SHAPES", name, getattr(batch, name), (num_logits,), rank)
    owner_req = np.repeat(np.arange(num_reqs), counts)
    local_pos = np.arange(num_logits) - cu[owner_req]
    expected_indices = qsl[owner_req + 1] - counts[owner_req] + local_pos
    actual = batch.logits_indices.detach().cpu().numpy()
    bad = first_bad(actual != expected_indices)
    require(
        bad is None,
        "PRE-LOGITS-TAIL",
        "logits_indices",
        "logits rows must be the last n_i tokens of each request's query",
        request=int(owner_req[bad]) if bad is not None else None,
        rank=rank,
    )
    slots = np.asarray(batch.idx_mapping_np)
    for name, expected in (("expanded_idx_mapping", slots[owner_req]), ("expanded_local_pos", local_pos)):
        bad = first_bad(getattr(batch, name).detach().cpu().numpy() != expected)
        require(
            bad is None,
            "PRE-EXPANDED",
            name,
            f"{name} disagrees with idx_mapping/cu_num_logits",
            request=int(owner_req[bad]) if bad is not None else None,
            rank=rank,
        )


def _counted(batch: InputBatch, rules: Rules) -> str:
    admitted = rules.admits_drafts and batch.num_admitted_draft_tokens is not None
    return "num_admitted_draft_tokens" if admitted else "num_draft_tokens_per_req"


def _check_drafts(batch: InputBatch, counts: np.ndarray, rank, rules: Rules) -> None:
    drafts = batch.num_draft_tokens_per_req
    if drafts is None:
        bad = first_bad(counts != 1)
        require(
            bad is None,
            "PRE-DRAFTS",
            "num_draft_tokens_per_req",
            "is None, so every request must have exactly 1 logits row",
            request=bad,
            rank=rank,
        )
        require(
            batch.num_draft_tokens == 0,
            "PRE-DRAFTS",
            "num_draft_tokens",
            f"is {batch.num_draft_tokens} without num_draft_tokens_per_req",
            rank=rank,
        )
        return
    drafts = np.asarray(drafts)
    require(
        np.issubdtype(drafts.dtype, np.integer),
        "PRE-DTYPES",
        "num_draft_tokens_per_req",
        f"dtype {drafts.dtype} is not an integer type",
        rank=rank,
    )
    require(
        drafts.shape == (batch.num_reqs,),
        "PRE-DRAFTS",
        "num_draft_tokens_per_req",
        f"shape {drafts.shape}, expected ({batch.num_reqs},)",
        rank=rank,
    )
    bad = first_bad(counts - 1 != drafts)
    require(
        bad is None,
        "PRE-DRAFTS",
        "num_draft_tokens_per_req",
        "a request's logits rows must be 1 + its draft tokens",
        request=bad,
        rank=rank,
    )
    expected = profile_rules.expected_num_draft_tokens(batch) if rules.admits_drafts else int(drafts.sum())
    require(
        batch.num_draft_tokens == expected,
        "PRE-DRAFTS",
        "num_draft_tokens",
        f"is {batch.num_draft_tokens}, but {_counted(batch, rules)} sums to {expected}",
        rank=rank,
    )


def check_grammar_output(
    grammar: GrammarOutput | None, batch: InputBatch, rank=None, rules: Rules | None = None
) -> None:
    """The grammar output's preconditions under ``rules`` (None: the default profile's)."""
    if grammar is None:
        return
    ids = grammar.structured_output_request_ids
    position = {req_id: i for i, req_id in enumerate(batch.req_ids)}
    for k, req_id in enumerate(ids):
        require(
            req_id in position,
            "PRE-GRAMMAR-IDS",
            "structured_output_request_ids",
            f"entry {k} ({req_id!r}) is not in the batch",
            rank=rank,
        )
    dup = duplicate_position(ids)
    require(
        dup is None,
        "PRE-GRAMMAR-IDS",
        "structured_output_request_ids",
        f"entry {dup} repeats a request id",
        request=position.get(ids[dup]) if dup is not None else None,
        rank=rank,
    )
    if (rules or default_rules()).grammar_blocks:
        profile_rules.check_grammar_blocks(grammar, batch, rank)
        return
    cu = np.asarray(batch.cu_num_logits_np)
    rows = sum(int(cu[position[r] + 1] - cu[position[r]]) for r in ids)
    bitmask = grammar.grammar_bitmask
    require(
        bitmask.dim() == 2 and bitmask.shape[0] == rows,
        "PRE-GRAMMAR-BITMASK",
        "grammar_bitmask",
        f"shape {tuple(bitmask.shape)}; expected {rows} rows (one per logits row of the listed requests)",
        rank=rank,
    )


def check_owner_table(owner_table, batch: InputBatch, *, max_num_reqs: int, tp_size: int, rank=None) -> None:
    """PRE-OWNER-TABLE and PRE-OWNER-TABLE-RANGE (owner rule owner_table), after the batch's checks: the
    slots index the table. Only the entries the batch reads are range-checked; the others may hold
    anything (CL-OWNER-TABLE)."""
    require(owner_table is not None, "PRE-OWNER-TABLE", "owner_table", "no owner table was passed", rank=rank)
    require(
        isinstance(owner_table, np.ndarray) and np.issubdtype(owner_table.dtype, np.integer),
        "PRE-OWNER-TABLE",
        "owner_table",
        f"{type(owner_table).__name__} of dtype {getattr(owner_table, 'dtype', None)} is not a numpy integer array",
        rank=rank,
    )
    require(
        owner_table.shape == (max_num_reqs,),
        "PRE-OWNER-TABLE",
        "owner_table",
        f"shape {owner_table.shape}, expected ({max_num_reqs},): one entry per slot",
        rank=rank,
    )
    owners = owner_table[np.asarray(batch.idx_mapping_np, dtype=np.intp)]
    bad = first_bad((owners < 0) | (owners >= tp_size))
    if bad is not None:
        raise PreconditionError(
            "PRE-OWNER-TABLE-RANGE",
            "owner_table",
            f"the owner of slot {int(batch.idx_mapping_np[bad])} is {int(owners[bad])}, outside [0, {tp_size})",
            request=bad,
            rank=rank,
        )
