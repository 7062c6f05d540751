"""Precondition checks of the spec, one function per group of inputs.

Each violation raises :class:`PreconditionError` naming the precondition ID,
the field and, where one is at fault, the request's batch position. The
checks read host copies and, once per step, the device copies they must
match: cheap next to sampling, and they can be switched off.
"""

from __future__ import annotations

import numpy as np
import torch

from shardspec.reference import profile_rules
from shardspec.spec.errors import PreconditionError
from shardspec.spec.model import (
    DEFAULT_PROFILE,
    EXTENSION_DTYPES,
    EXTENSION_KINDS,
    VLLM_033,
    BatchShardMetadata,
    ExtensionSpec,
    GrammarOutput,
    InputBatch,
    SamplerOutput,
)

_INT_DTYPES = (torch.int32, torch.int64)


def _first_bad(mask: np.ndarray) -> int | None:
    bad = np.flatnonzero(mask)
    return int(bad[0]) if bad.size else None


def _require(cond: bool, pid: str, field: str, message: str, request=None, rank=None) -> None:
    if not cond:
        raise PreconditionError(pid, field, message, request=request, rank=rank)


def _check_shape(pid: str, field: str, value, expected: tuple, rank) -> None:
    _require(tuple(value.shape) == expected, pid, field, f"shape {tuple(value.shape)}, expected {expected}", rank=rank)


def check_input_batch(
    batch: InputBatch, *, max_num_reqs: int, max_num_logits_per_req: int, rank=None, profile: str = DEFAULT_PROFILE
) -> None:
    num_reqs = batch.num_reqs
    _require(
        len(batch.req_ids) == num_reqs and batch.idx_mapping_np.shape == (num_reqs,),
        "PRE-BATCH-SIZE",
        "num_reqs",
        f"num_reqs={num_reqs} but {len(batch.req_ids)} req_ids and idx_mapping_np of shape "
        f"{tuple(batch.idx_mapping_np.shape)}",
        rank=rank,
    )
    _require(
        num_reqs <= max_num_reqs,
        "PRE-CAPACITY-REQS",
        "num_reqs",
        f"{num_reqs} requests exceed the sharder's capacity max_num_reqs={max_num_reqs}",
        rank=rank,
    )
    _check_slots(batch, max_num_reqs, rank)
    cu = _check_cu_num_logits(batch, max_num_logits_per_req, rank)
    if profile == VLLM_033:
        profile_rules.check_admitted_drafts(batch, rank)
        profile_rules.check_seq_lens_upper_bound(batch, rank)
    _check_drafts(batch, cu, rank, profile)
    # The device fields lay out the admitted rows where admitted counts are given (CL-ADMITTED-DRAFTS).
    device_cu = profile_rules.device_cu_num_logits(batch, profile)
    _check_device_cu(batch, device_cu, rank)
    _check_token_layout(batch, device_cu, rank)
    # Last: its outcome is undefined, so a batch that also breaks a must-reject precondition
    # names that one (and a slot shared by two requests is not reported as a shared id).
    _require(
        len(set(batch.req_ids)) == num_reqs,
        "PRE-REQ-IDS-UNIQUE",
        "req_ids",
        "request ids are not unique",
        request=_duplicate_position(batch.req_ids),
        rank=rank,
    )


def _duplicate_position(items: list) -> int | None:
    seen = set()
    for position, item in enumerate(items):
        if item in seen:
            return position
        seen.add(item)
    return None


def _check_slots(batch: InputBatch, max_num_reqs: int, rank) -> None:
    slots = np.asarray(batch.idx_mapping_np)
    _require(
        np.issubdtype(slots.dtype, np.integer),
        "PRE-DTYPES",
        "idx_mapping_np",
        f"dtype {slots.dtype} is not an integer type",
        rank=rank,
    )
    bad = _first_bad((slots < 0) | (slots >= max_num_reqs))
    _require(
        bad is None,
        "PRE-SLOT-RANGE",
        "idx_mapping",
        f"slot {slots[bad] if bad is not None else ''} is outside [0, {max_num_reqs})",
        request=bad,
        rank=rank,
    )
    _require(
        len(np.unique(slots)) == slots.shape[0],
        "PRE-SLOT-UNIQUE",
        "idx_mapping",
        "two requests share a slot",
        request=_duplicate_position(slots.tolist()),
        rank=rank,
    )
    _require(
        batch.idx_mapping.dtype in _INT_DTYPES,
        "PRE-DTYPES",
        "idx_mapping",
        f"dtype {batch.idx_mapping.dtype} is not int32/int64",
        rank=rank,
    )
    device_slots = batch.idx_mapping.detach().cpu().numpy()
    _require(
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
    return _first_bad(a != b)


def _check_cu_num_logits(batch: InputBatch, max_num_logits_per_req: int, rank) -> np.ndarray:
    num_reqs = batch.num_reqs
    cu = np.asarray(batch.cu_num_logits_np)
    _require(
        cu.shape == (num_reqs + 1,),
        "PRE-CU-LOGITS",
        "cu_num_logits_np",
        f"shape {cu.shape}, expected ({num_reqs + 1},)",
        rank=rank,
    )
    _require(int(cu[0]) == 0, "PRE-CU-LOGITS", "cu_num_logits_np", f"starts at {int(cu[0])}, not 0", rank=rank)
    counts = np.diff(cu.astype(np.int64))
    bad = _first_bad(counts < 1)
    _require(
        bad is None,
        "PRE-LOGITS-PER-REQ",
        "cu_num_logits",
        f"request has {counts[bad] if bad is not None else ''} logits rows; at least 1 is required",
        request=bad,
        rank=rank,
    )
    bad = _first_bad(counts > max_num_logits_per_req)
    _require(
        bad is None,
        "PRE-CAPACITY-LOGITS",
        "cu_num_logits",
        f"request has {counts[bad] if bad is not None else ''} logits rows, more than the "
        f"sharder's capacity max_num_logits_per_req={max_num_logits_per_req}",
        request=bad,
        rank=rank,
    )
    return cu.astype(np.int64)


def _check_device_cu(batch: InputBatch, expected: np.ndarray, rank) -> None:
    _require(
        batch.cu_num_logits.dtype in _INT_DTYPES,
        "PRE-DTYPES",
        "cu_num_logits",
        f"dtype {batch.cu_num_logits.dtype} is not int32/int64",
        rank=rank,
    )
    device_cu = batch.cu_num_logits.detach().cpu().numpy()
    _require(
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
    _require(
        qsl.shape == (num_reqs + 1,) and (num_reqs == 0 or qsl[0] == 0),
        "PRE-QUERY-START-LOC",
        "query_start_loc",
        f"shape {qsl.shape} or start {qsl[:1]} is not ({num_reqs + 1},) from 0",
        rank=rank,
    )
    counts = np.diff(cu)
    bad = _first_bad(np.diff(qsl) < counts)
    _require(
        bad is None,
        "PRE-QUERY-START-LOC",
        "query_start_loc",
        "query is shorter than the request's logits rows (or decreasing)",
        request=bad,
        rank=rank,
    )
    _check_shape("PRE-FIELD-SHAPES", "seq_lens", batch.seq_lens, (num_reqs,), rank)
    for name in ("logits_indices", "expanded_idx_mapping", "expanded_local_pos"):
        _check_shape("PRE-FIELD-SHAPES", name, getattr(batch, name), (num_logits,), rank)
    owner_req = np.repeat(np.arange(num_reqs), counts)
    local_pos = np.arange(num_logits) - cu[owner_req]
    expected_indices = qsl[owner_req + 1] - counts[owner_req] + local_pos
    actual = batch.logits_indices.detach().cpu().numpy()
    bad = _first_bad(actual != expected_indices)
    _require(
        bad is None,
        "PRE-LOGITS-TAIL",
        "logits_indices",
        "logits rows must be the last n_i tokens of each request's query",
        request=int(owner_req[bad]) if bad is not None else None,
        rank=rank,
    )
    slots = np.asarray(batch.idx_mapping_np, dtype=np.int64)
    for name, expected in (("expanded_idx_mapping", slots[owner_req]), ("expanded_local_pos", local_pos)):
        bad = _first_bad(getattr(batch, name).detach().cpu().numpy() != expected)
        _require(
            bad is None,
            "PRE-EXPANDED",
            name,
            f"{name} disagrees with idx_mapping/cu_num_logits",
            request=int(owner_req[bad]) if bad is not None else None,
            rank=rank,
        )


def _counted(batch: InputBatch, profile: str) -> str:
    admitted = profile == VLLM_033 and batch.num_admitted_draft_tokens is not None
    return "num_admitted_draft_tokens" if admitted else "num_draft_tokens_per_req"


def _check_drafts(batch: InputBatch, cu: np.ndarray, rank, profile: str) -> None:
    counts = np.diff(cu)
    drafts = batch.num_draft_tokens_per_req
    if drafts is None:
        bad = _first_bad(counts != 1)
        _require(
            bad is None,
            "PRE-DRAFTS",
            "num_draft_tokens_per_req",
            "is None, so every request must have exactly 1 logits row",
            request=bad,
            rank=rank,
        )
        _require(
            batch.num_draft_tokens == 0,
            "PRE-DRAFTS",
            "num_draft_tokens",
            f"is {batch.num_draft_tokens} without num_draft_tokens_per_req",
            rank=rank,
        )
        return
    drafts = np.asarray(drafts)
    _require(
        drafts.dtype.kind in "iu",
        "PRE-DTYPES",
        "num_draft_tokens_per_req",
        f"dtype {drafts.dtype} is not an integer type",
        rank=rank,
    )
    _require(
        drafts.shape == (batch.num_reqs,),
        "PRE-DRAFTS",
        "num_draft_tokens_per_req",
        f"shape {drafts.shape}, expected ({batch.num_reqs},)",
        rank=rank,
    )
    bad = _first_bad(counts != drafts.astype(np.int64) + 1)
    _require(
        bad is None,
        "PRE-DRAFTS",
        "num_draft_tokens_per_req",
        "a request's logits rows must be 1 + its draft tokens",
        request=bad,
        rank=rank,
    )
    expected = profile_rules.expected_num_draft_tokens(batch) if profile == VLLM_033 else int(drafts.sum())
    _require(
        batch.num_draft_tokens == expected,
        "PRE-DRAFTS",
        "num_draft_tokens",
        f"is {batch.num_draft_tokens}, but {_counted(batch, profile)} sums to {expected}",
        rank=rank,
    )


def check_grammar_output(
    grammar: GrammarOutput | None, batch: InputBatch, rank=None, profile: str = DEFAULT_PROFILE
) -> None:
    if grammar is None:
        return
    ids = grammar.structured_output_request_ids
    position = {req_id: i for i, req_id in enumerate(batch.req_ids)}
    for k, req_id in enumerate(ids):
        _require(
            req_id in position,
            "PRE-GRAMMAR-IDS",
            "structured_output_request_ids",
            f"entry {k} ({req_id!r}) is not in the batch",
            rank=rank,
        )
    dup = _duplicate_position(ids)
    _require(
        dup is None,
        "PRE-GRAMMAR-IDS",
        "structured_output_request_ids",
        f"entry {dup} repeats a request id",
        request=position.get(ids[dup]) if dup is not None else None,
        rank=rank,
    )
    if profile == VLLM_033:
        profile_rules.check_grammar_blocks(grammar, batch, rank)
        return
    cu = np.asarray(batch.cu_num_logits_np, dtype=np.int64)
    rows = sum(int(cu[position[r] + 1] - cu[position[r]]) for r in ids)
    bitmask = grammar.grammar_bitmask
    _require(
        bitmask.dim() == 2 and bitmask.shape[0] == rows,
        "PRE-GRAMMAR-BITMASK",
        "grammar_bitmask",
        f"shape {tuple(bitmask.shape)}; expected {rows} rows (one per logits row of the listed requests)",
        rank=rank,
    )


def check_local_output(
    local_output: SamplerOutput | None,
    local_batch: InputBatch,
    *,
    gather_num_nans: bool,
    logprobs_dims,
    rank=None,
) -> None:
    num_local_reqs, num_local_logits = local_batch.num_reqs, local_batch.num_logits
    # logprobs_dims is replicated: check it before the local output, so that a
    # rank owning nothing rejects it too instead of entering the collectives.
    if logprobs_dims is not None:
        _require(
            len(logprobs_dims) == 2 and min(logprobs_dims) >= 0,
            "PRE-LOGPROBS-DIMS",
            "logprobs_dims",
            f"{logprobs_dims} is not a pair of non-negative ints",
            rank=rank,
        )
    if local_output is None:
        _require(
            num_local_reqs == 0,
            "PRE-LOCAL-OUTPUT",
            "local_output",
            f"is None but this rank owns {num_local_reqs} requests",
            rank=rank,
        )
        return
    ids = local_output.sampled_token_ids
    _require(
        ids.dim() == 2 and ids.shape[0] == num_local_reqs,
        "PRE-LOCAL-OUTPUT",
        "sampled_token_ids",
        f"shape {tuple(ids.shape)}; expected ({num_local_reqs}, width)",
        rank=rank,
    )
    for name in ("num_sampled", "num_rejected"):
        value = getattr(local_output, name)
        _require(
            value is not None and tuple(value.shape) == (num_local_reqs,),
            "PRE-LOCAL-OUTPUT",
            name,
            f"is {None if value is None else tuple(value.shape)}; expected shape ({num_local_reqs},)",
            rank=rank,
        )
    if gather_num_nans:
        nans = local_output.num_nans
        _require(
            nans is not None and tuple(nans.shape) == (num_local_logits,),
            "PRE-LOCAL-OUTPUT",
            "num_nans",
            f"is {None if nans is None else tuple(nans.shape)}; gather_num_nans needs one count per "
            f"local logits row ({num_local_logits},)",
            rank=rank,
        )
    if logprobs_dims is not None:
        lp = local_output.logprobs_tensors
        if lp is not None:
            for name in ("logprob_token_ids", "logprobs"):
                value = getattr(lp, name)
                _require(
                    value.dim() == 2 and value.shape[0] == num_local_logits,
                    "PRE-LOCAL-OUTPUT",
                    name,
                    f"shape {tuple(value.shape)}; expected ({num_local_logits}, columns)",
                    rank=rank,
                )
            _require(
                lp.logprob_token_ids.shape == lp.logprobs.shape,
                "PRE-LOCAL-OUTPUT",
                "logprobs",
                "logprob_token_ids and logprobs differ in shape",
                rank=rank,
            )
            _require(
                tuple(lp.selected_token_ranks.shape) == (num_local_logits,),
                "PRE-LOCAL-OUTPUT",
                "selected_token_ranks",
                f"shape {tuple(lp.selected_token_ranks.shape)}",
                rank=rank,
            )


def check_logits_shard(logits_shard: torch.Tensor, metadata: BatchShardMetadata, rank=None) -> None:
    """This rank's own shard only: whether every rank's width is the same is not checkable here."""
    num_logits = int(sum(metadata.num_logits_per_rank))
    _require(
        isinstance(logits_shard, torch.Tensor) and logits_shard.is_floating_point(),
        "PRE-LOGITS-SHARD",
        "logits_shard",
        f"is {getattr(logits_shard, 'dtype', type(logits_shard).__name__)}, not a floating point tensor",
        rank=rank,
    )
    _require(
        logits_shard.dim() == 2 and logits_shard.shape[0] == num_logits and logits_shard.shape[1] >= 1,
        "PRE-LOGITS-SHARD",
        "logits_shard",
        f"shape {tuple(logits_shard.shape)}; expected ({num_logits}, Vs) with Vs >= 1",
        rank=rank,
    )


def check_extension_declarations(extension_fields: dict | None, rank=None) -> None:
    """The replicated declarations: every rank reaches the same verdict."""
    if extension_fields is None:
        return
    for name, spec in extension_fields.items():
        _require(
            isinstance(name, str) and isinstance(spec, ExtensionSpec),
            "PRE-EXTENSION-SUPPORTED",
            "extension_fields",
            f"entry {name!r} is not a str -> ExtensionSpec pair",
            rank=rank,
        )
        _require(
            spec.per in EXTENSION_KINDS,
            "PRE-EXTENSION-SUPPORTED",
            "extension_fields",
            f"{name}: kind {spec.per!r} is not one of {EXTENSION_KINDS}",
            rank=rank,
        )
        _require(
            spec.dtype in EXTENSION_DTYPES,
            "PRE-EXTENSION-SUPPORTED",
            "extension_fields",
            f"{name}: dtype {spec.dtype} is not supported",
            rank=rank,
        )
        _require(
            all(isinstance(d, int) and d >= 0 for d in spec.shape),
            "PRE-EXTENSION-SUPPORTED",
            "extension_fields",
            f"{name}: trailing shape {spec.shape} is not a tuple of sizes",
            rank=rank,
        )


def check_local_extensions(
    local_output: SamplerOutput | None, local_batch: InputBatch, extension_fields: dict | None, rank=None
) -> None:
    """Every extension field the local output carries is declared, and every declared one is there."""
    carried = {} if local_output is None or local_output.extensions is None else local_output.extensions
    declared = extension_fields or {}
    for name in carried:
        _require(
            name in declared,
            "PRE-EXTENSION-FIELDS",
            f"extensions.{name}",
            "is not declared in extension_fields, so the gather would drop it",
            rank=rank,
        )
    rows = {"request": local_batch.num_reqs, "logits_row": local_batch.num_logits}
    for name, spec in declared.items():
        value = carried.get(name)
        if value is None:
            _require(
                local_batch.num_reqs == 0,
                "PRE-EXTENSION-FIELDS",
                f"extensions.{name}",
                f"is declared but missing, and this rank owns {local_batch.num_reqs} requests",
                rank=rank,
            )
            continue
        expected = (rows[spec.per], *spec.shape)
        _require(
            isinstance(value, torch.Tensor) and value.dtype == spec.dtype and tuple(value.shape) == expected,
            "PRE-EXTENSION-FIELDS",
            f"extensions.{name}",
            f"is {getattr(value, 'dtype', type(value).__name__)} {tuple(getattr(value, 'shape', ()))}; "
            f"declared {spec.dtype} {expected}",
            rank=rank,
        )
