"""Named edits of a case's inputs, and the extension fields a case declares.

A case lists ``edits`` by name: each changes the inputs that :func:`build_case_inputs`
built, at one stage of the step, either to violate one precondition on purpose
(the case then sets ``expect_error``) or to give a valid input in a form the
plain builders never produce (another integer dtype, an engine's own batch type).
A case's ``extensions`` declare extension fields (CL-EXTENSION-FIELDS); every
rank's sampler output then carries each one, filled with values that are a
function of the request's slot and row position only, so a checker can tell
from a gathered row which request it came from.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from shardspec.spec.model import ExtensionSpec, InputBatch, SamplerOutput

# -- extension fields ---------------------------------------------------------------

DTYPES = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


def extension_fields(declared: dict) -> dict[str, ExtensionSpec] | None:
    """A case's declarations (name -> {per, dtype, shape}) as ExtensionSpecs; None when it declares none."""
    if not declared:
        return None
    return {
        name: ExtensionSpec(per=d["per"], dtype=DTYPES[d["dtype"]], shape=tuple(d.get("shape", ())))
        for name, d in declared.items()
    }


def extension_rows(name: str, spec: ExtensionSpec, slots: np.ndarray, positions: np.ndarray) -> torch.Tensor:
    """[len(slots), *E] values of the entries of (slot, row position) pairs, in ``spec.dtype``."""
    salt = zlib.crc32(name.encode()) % 97
    width = int(np.prod(spec.shape)) if spec.shape else 1
    base = np.asarray(slots, dtype=np.int64) * 37 + np.asarray(positions, dtype=np.int64) * 11 + salt
    values = base[:, None] + np.arange(width, dtype=np.int64)[None, :]
    if spec.dtype == torch.bool:
        # Alternating, and the entry's last element always set: a wide entry cut short (its tail dropped or
        # zeroed) differs from it whatever the entry's keys (a single request's mask included).
        flags = values % 2 == 1
        flags[:, -1] = True
        data = torch.from_numpy(flags)
    elif spec.dtype in (torch.uint8, torch.int8, torch.int16):
        data = torch.from_numpy(values % 100).to(spec.dtype)
    elif spec.dtype.is_floating_point:
        data = (torch.from_numpy(values).to(torch.float64) / 4).to(spec.dtype)
    else:
        data = torch.from_numpy(values).to(spec.dtype)
    return data.reshape(len(values), *spec.shape)


def entry_keys(batch: InputBatch, per: str, cu_num_logits=None) -> tuple[np.ndarray, np.ndarray]:
    """(slot, row position) of each entry of a field of kind ``per`` for ``batch``, in batch order; a
    per-row field has the rows ``cu_num_logits`` counts (default the batch's cu_num_logits_np)."""
    slots = np.asarray(batch.idx_mapping_np, dtype=np.int64)
    if per == "request":
        return slots, np.zeros_like(slots)
    cu = batch.cu_num_logits_np if cu_num_logits is None else cu_num_logits
    counts = np.diff(np.asarray(cu, dtype=np.int64))
    positions = np.concatenate([np.arange(c) for c in counts]) if counts.size else np.zeros(0, np.int64)
    return np.repeat(slots, counts), positions


def batch_extension_values(
    name: str, spec: ExtensionSpec, batch: InputBatch, device, cu_num_logits=None
) -> torch.Tensor:
    """The field's values for every entry of ``batch`` (local or global), on ``device``; ``cu_num_logits``
    as for :func:`entry_keys`."""
    return extension_rows(name, spec, *entry_keys(batch, spec.per, cu_num_logits)).to(device)


# -- named edits ----------------------------------------------------------------------


@dataclass
class EngineInputBatch(InputBatch):
    """An engine's batch with a field this spec does not list (INV-LOCAL-UNLISTED-FIELDS)."""

    engine_positions: torch.Tensor | None = None


def _batch(**changes) -> Callable:
    return lambda batch, grammar: (replace(batch, **{k: f(batch) for k, f in changes.items()}), grammar)


def _engine_batch(batch: InputBatch, grammar):
    values = {f: getattr(batch, f) for f in batch.__dataclass_fields__}
    positions = torch.arange(batch.num_reqs, dtype=torch.int64, device=batch.idx_mapping.device) * 3
    return EngineInputBatch(**values, engine_positions=positions), grammar


def _host_device_mismatch(batch: InputBatch) -> torch.Tensor:
    # Another slot below the largest one, so only the host/device agreement is broken.
    device_slots = batch.idx_mapping.clone()
    device_slots[0] = (device_slots[0] + 1) % (int(batch.idx_mapping_np.max()) + 2)
    return device_slots


def _one_long(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its last entry repeated: one entry too many, and no value outside what it held."""
    return torch.cat([t, t[-1:]])


def _free_slot(batch: InputBatch) -> int:
    """A slot no request of ``batch`` has (so that a host copy one entry long repeats no slot)."""
    used = set(np.asarray(batch.idx_mapping_np).tolist())
    return next(s for s in range(len(used) + 1) if s not in used)


# The valid edits other modules name: vllm-0.33's optional bound left out, float32's limits in the logits.
UPPER_BOUND_ABSENT = "seq-lens-upper-bound-absent"
LOGITS_LIMITS_EDIT = "logits-limits"

# The valid edits that pass a host field in another dtype than the builders' (an engine that builds only its
# own dtypes never sends them: spec/guarantees.py): edit -> (batch field, dtype).
DTYPE_EDITS = {
    "idx-mapping-np-int32": ("idx_mapping_np", "int32"),
    "draft-counts-int64": ("num_draft_tokens_per_req", "int64"),
}

# stage "inputs": f(batch, grammar) -> (batch, grammar)
INPUT_EDITS: dict[str, Callable] = {
    "req-ids-short": _batch(req_ids=lambda b: b.req_ids[:-1]),
    "req-ids-repeat": _batch(req_ids=lambda b: [*b.req_ids[:-1], b.req_ids[0]]),
    "idx-mapping-float": _batch(idx_mapping=lambda b: b.idx_mapping.to(torch.float32)),
    "host-device-mismatch": _batch(idx_mapping=_host_device_mismatch),
    "cu-logits-from-one": _batch(cu_num_logits_np=lambda b: b.cu_num_logits_np + 1),
    "query-start-loc-from-one": _batch(query_start_loc=lambda b: b.query_start_loc + 1),
    "seq-lens-short": _batch(seq_lens=lambda b: b.seq_lens[:-1]),
    "logits-indices-reversed": _batch(logits_indices=lambda b: b.logits_indices.flip(0)),
    "expanded-pos-plus-one": _batch(expanded_local_pos=lambda b: b.expanded_local_pos + 1),
    "draft-total-plus-one": _batch(num_draft_tokens=lambda b: b.num_draft_tokens + 1),
    "grammar-bitmask-short": lambda b, g: (b, replace(g, grammar_bitmask=g.grammar_bitmask[:-1])),
    # vllm-0.33's fields.
    "seq-lens-upper-bound-short": _batch(seq_lens_cpu_upper_bound=lambda b: b.seq_lens_cpu_upper_bound[:-1]),
    # Valid: the bound is optional (an engine that has none passes None).
    UPPER_BOUND_ABSENT: _batch(seq_lens_cpu_upper_bound=lambda b: None),
    "acceptable-drafts-extra": lambda b, g: (b, replace(g, num_acceptable_drafts=[*g.num_acceptable_drafts, 0])),
    # Valid inputs in forms the builders do not produce.
    "idx-mapping-np-int32": _batch(idx_mapping_np=lambda b: np.asarray(b.idx_mapping_np, dtype=np.int32)),
    "draft-counts-int64": _batch(
        num_draft_tokens_per_req=lambda b: (
            None if b.num_draft_tokens_per_req is None else np.asarray(b.num_draft_tokens_per_req, dtype=np.int64)
        )
    ),
    "engine-batch-field": _engine_batch,
    # Violations at the boundaries the preconditions state (conformance/cases/boundaries.py).
    "num-reqs-plus-one": _batch(num_reqs=lambda b: b.num_reqs + 1),
    "idx-mapping-np-short": _batch(idx_mapping_np=lambda b: b.idx_mapping_np[:-1]),
    "idx-mapping-np-float64": _batch(idx_mapping_np=lambda b: np.asarray(b.idx_mapping_np, dtype=np.float64)),
    "draft-counts-float32": _batch(
        num_draft_tokens_per_req=lambda b: np.asarray(b.num_draft_tokens_per_req, dtype=np.float32)
    ),
    "cu-logits-np-short": _batch(cu_num_logits_np=lambda b: b.cu_num_logits_np[:-1]),
    "logits-indices-short": _batch(logits_indices=lambda b: b.logits_indices[:-1]),
    "expanded-idx-mapping-short": _batch(expanded_idx_mapping=lambda b: b.expanded_idx_mapping[:-1]),
    "expanded-local-pos-short": _batch(expanded_local_pos=lambda b: b.expanded_local_pos[:-1]),
    # The other side of each length: one entry too many (a copy of the last, so only the length is wrong).
    "req-ids-long": _batch(req_ids=lambda b: [*b.req_ids, "req-extra"]),
    "idx-mapping-np-long": _batch(idx_mapping_np=lambda b: np.append(b.idx_mapping_np, _free_slot(b))),
    "cu-logits-np-long": _batch(cu_num_logits_np=lambda b: np.append(b.cu_num_logits_np, b.cu_num_logits_np[-1] + 1)),
    "seq-lens-long": _batch(seq_lens=lambda b: _one_long(b.seq_lens)),
    "seq-lens-upper-bound-long": _batch(seq_lens_cpu_upper_bound=lambda b: _one_long(b.seq_lens_cpu_upper_bound)),
    "logits-indices-long": _batch(logits_indices=lambda b: _one_long(b.logits_indices)),
    "expanded-idx-mapping-long": _batch(expanded_idx_mapping=lambda b: _one_long(b.expanded_idx_mapping)),
    "expanded-local-pos-long": _batch(expanded_local_pos=lambda b: _one_long(b.expanded_local_pos)),
    "grammar-bitmask-long": lambda b, g: (b, replace(g, grammar_bitmask=_one_long(g.grammar_bitmask))),
    "grammar-id-unknown": lambda b, g: (
        b,
        replace(g, structured_output_request_ids=[*g.structured_output_request_ids[:-1], "req-unknown"]),
    ),
}


def _first_read_entry(value: int) -> Callable:
    """The owner table with the entry of the batch's first slot set to ``value(tp)``."""

    def edit(table: np.ndarray, batch: InputBatch, tp: int) -> np.ndarray:
        table = table.copy()
        table[int(batch.idx_mapping_np[0])] = value(tp)
        return table

    return edit


# stage "owner table" (owner rule owner_table): f(table, batch, tp) -> the table shard_sampler_inputs gets.
# Violations of PRE-OWNER-TABLE and PRE-OWNER-TABLE-RANGE (conformance/cases/boundaries.py).
OWNER_TABLE_EDITS: dict[str, Callable] = {
    "owner-table-short": lambda t, b, tp: t[:-1],
    "owner-table-long": lambda t, b, tp: np.append(t, t[-1]),
    "owner-table-float64": lambda t, b, tp: t.astype(np.float64),
    "owner-table-absent": lambda t, b, tp: None,
    "owner-table-negative": _first_read_entry(lambda tp: -1),
    "owner-table-past-tp": _first_read_entry(lambda tp: tp),
}


def _extra_row(out: SamplerOutput) -> SamplerOutput:
    ids = out.sampled_token_ids
    return replace(out, sampled_token_ids=torch.cat([ids, ids[:1]]))


def _undeclared_extension(out: SamplerOutput) -> SamplerOutput:
    mask = torch.ones(out.num_sampled.shape[0], dtype=torch.bool, device=out.num_sampled.device)
    return replace(out, extensions={**(out.extensions or {}), "undeclared_mask": mask})


def _missing_extension(out: SamplerOutput) -> SamplerOutput:
    """The local output without its first declared extension field."""
    fields = dict(out.extensions or {})
    fields.pop(next(iter(fields)), None)
    return replace(out, extensions=fields or None)


# stage "logits_shard": f(tensor) -> tensor; stage "local_output": f(SamplerOutput) -> SamplerOutput
LOGITS_SHARD_EDITS: dict[str, Callable] = {
    "logits-shard-extra-row": lambda s: torch.cat([s, s[:1]]),
    "logits-shard-short": lambda s: s[:-1],
    "logits-shard-int32": lambda s: s.to(torch.int32),
}
LOCAL_OUTPUT_EDITS: dict[str, Callable] = {
    "local-output-extra-row": _extra_row,
    "extension-undeclared": _undeclared_extension,
    "extension-missing": _missing_extension,
}
# float32's limits, each put into one logits row by the "logits-limits" edit (in the logits' own dtype they
# may round: float32's largest is +inf in float16, its smallest subnormal 0 in bfloat16).
LOGITS_LIMITS = (float("inf"), float("-inf"), 3.4028234663852886e38, -3.4028234663852886e38, 1.401298464324817e-45)


def _logits_limits(logits: torch.Tensor, logits_rows: torch.Tensor) -> torch.Tensor:
    """Each limit in a few columns of one logits row (rows taken in turn), spaced an eighth of the vocab
    apart so that every vocab shard of up to 8 ranks holds one."""
    rows = logits_rows.tolist()
    if not rows:
        return logits
    logits = logits.clone()
    step = max(1, logits.shape[1] // 8)
    for k, value in enumerate(LOGITS_LIMITS):
        logits[rows[k % len(rows)], (3 * k) % step :: step] = value
    return logits


# stage "token logits": f(token logits [T, Vp], the tokens that are logits rows) -> token logits, before any
# path reads them (the unsharded path too). Valid: logits at their dtype's limits.
TOKEN_LOGITS_EDITS: dict[str, Callable] = {LOGITS_LIMITS_EDIT: _logits_limits}

# extension_fields={}: declared, none of them (a case's empty ``extensions`` declares nothing, None).
EXTENSIONS_DECLARED_EMPTY = "extension-fields-declared-empty"
GATHER_EDITS = (EXTENSIONS_DECLARED_EMPTY,)
EDIT_NAMES = (
    *GATHER_EDITS,
    *INPUT_EDITS,
    *OWNER_TABLE_EDITS,
    *TOKEN_LOGITS_EDITS,
    *LOGITS_SHARD_EDITS,
    *LOCAL_OUTPUT_EDITS,
)


def check_edit_names(edits) -> None:
    unknown = [name for name in edits if name not in EDIT_NAMES]
    if unknown:
        raise ValueError(f"unknown case edit(s) {unknown}; known: {', '.join(EDIT_NAMES)}")


def edit_inputs(batch: InputBatch, grammar, edits) -> tuple:
    for name in edits:
        if name in INPUT_EDITS:
            batch, grammar = INPUT_EDITS[name](batch, grammar)
    return batch, grammar


def edit_owner_table(table: np.ndarray, batch: InputBatch, tp: int, edits) -> np.ndarray | None:
    for name in edits:
        if name in OWNER_TABLE_EDITS:
            table = OWNER_TABLE_EDITS[name](table, batch, tp)
    return table


def edit_token_logits(logits: torch.Tensor, logits_rows: torch.Tensor, edits) -> torch.Tensor:
    for name in edits:
        if name in TOKEN_LOGITS_EDITS:
            logits = TOKEN_LOGITS_EDITS[name](logits, logits_rows)
    return logits


def edit_logits_shard(shard: torch.Tensor, edits) -> torch.Tensor:
    for name in edits:
        if name in LOGITS_SHARD_EDITS:
            shard = LOGITS_SHARD_EDITS[name](shard)
    return shard


def finish_local_output(
    out: SamplerOutput | None, local_batch: InputBatch, declared: dict, edits, device
) -> SamplerOutput | None:
    """The sampler output with the case's extension fields attached and its local-output edits applied."""
    fields = extension_fields(declared)
    if out is not None and fields:
        values = {name: batch_extension_values(name, spec, local_batch, device) for name, spec in fields.items()}
        out = replace(out, extensions=values)
    for name in edits:
        if name in LOCAL_OUTPUT_EDITS and out is not None:
            out = LOCAL_OUTPUT_EDITS[name](out)
    return out


def gather_options(declared: dict, edits=()) -> dict:
    """Extra keyword arguments of gather_sampler_output: only a case that declares fields passes any (or
    an empty declaration, with EXTENSIONS_DECLARED_EMPTY)."""
    fields = declared_fields(declared, edits)
    return {} if fields is None else {"extension_fields": fields}


def declared_fields(declared: dict, edits=()) -> dict[str, ExtensionSpec] | None:
    """The extension_fields a case passes: its declarations, {} with EXTENSIONS_DECLARED_EMPTY, else None."""
    fields = extension_fields(declared)
    return {} if fields is None and EXTENSIONS_DECLARED_EMPTY in edits else fields


def gather_kwargs(case) -> dict:
    """The keyword arguments of a case's gather_sampler_output call."""
    return {
        "gather_num_nans": case.gather_num_nans,
        "logprobs_dims": case.logprobs_dims,
        **gather_options(case.extensions, case.edits),
    }
