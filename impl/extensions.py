"""Extension fields of the gather: an engine's own per-request or per-row sampler outputs.

Off the hot path (only where the caller declares fields), so plain torch
operations do it: one all-gather per declared field, in declaration order, in
the reference's padded layouts, so a mixed group agrees on the wire. A
per-request field travels like the sampled ids (send row j is local request j,
M rows); a per-row field like the logprobs (row j * W + p is local request j's
p-th logits row, M * W rows). Padding rows are zeros.
"""

from __future__ import annotations

import numpy as np
import torch

from shardspec.spec.errors import PreconditionError
from shardspec.spec.model import EXTENSION_DTYPES, EXTENSION_KINDS, BatchShardMetadata, ExtensionSpec, SamplerOutput


def _fail(pid: str, field: str, message: str, rank) -> None:
    raise PreconditionError(pid, field, message, rank=rank)


def check_declarations(extension_fields: dict | None, rank) -> None:
    """PRE-EXTENSION-SUPPORTED: replicated declarations, so every rank rejects them alike."""
    for name, spec in (extension_fields or {}).items():
        if not isinstance(name, str) or not isinstance(spec, ExtensionSpec):
            _fail(
                "PRE-EXTENSION-SUPPORTED",
                "extension_fields",
                f"entry {name!r} is not a str -> ExtensionSpec pair",
                rank,
            )
        if spec.per not in EXTENSION_KINDS:
            _fail(
                "PRE-EXTENSION-SUPPORTED",
                "extension_fields",
                f"{name}: kind {spec.per!r} is not one of {EXTENSION_KINDS}",
                rank,
            )
        if spec.dtype not in EXTENSION_DTYPES:
            _fail("PRE-EXTENSION-SUPPORTED", "extension_fields", f"{name}: dtype {spec.dtype} is not supported", rank)
        if not all(isinstance(d, int) and d >= 0 for d in spec.shape):
            _fail(
                "PRE-EXTENSION-SUPPORTED",
                "extension_fields",
                f"{name}: trailing shape {spec.shape} is not a tuple of sizes",
                rank,
            )


def check_local_fields(
    local_output: SamplerOutput | None, num_local_reqs: int, num_local_logits: int, extension_fields: dict | None, rank
) -> None:
    """PRE-EXTENSION-FIELDS: every carried field is declared; every declared one is there, as declared."""
    carried = _carried(local_output)
    declared = extension_fields or {}
    for name in carried:
        if name not in declared:
            _fail(
                "PRE-EXTENSION-FIELDS",
                f"extensions.{name}",
                "is not declared in extension_fields, so the gather would drop it",
                rank,
            )
    rows = {"request": num_local_reqs, "logits_row": num_local_logits}
    for name, spec in declared.items():
        value = carried.get(name)
        if value is None:
            if num_local_reqs:
                _fail(
                    "PRE-EXTENSION-FIELDS",
                    f"extensions.{name}",
                    f"is declared but missing, and this rank owns {num_local_reqs} requests",
                    rank,
                )
            continue
        expected = (rows[spec.per], *spec.shape)
        if not isinstance(value, torch.Tensor) or value.dtype != spec.dtype or tuple(value.shape) != expected:
            _fail(
                "PRE-EXTENSION-FIELDS",
                f"extensions.{name}",
                f"is {getattr(value, 'dtype', type(value).__name__)} {tuple(getattr(value, 'shape', ()))}; "
                f"declared {spec.dtype} {expected}",
                rank,
            )


def gather_extensions(
    comm,
    local_output: SamplerOutput | None,
    metadata: BatchShardMetadata,
    global_cu_np: np.ndarray,
    local_cu_np: np.ndarray,
    extension_fields: dict[str, ExtensionSpec],
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """Every declared field in batch order: [N, *E] per request, [L, *E] per logits row."""
    width, per_rank, tp = metadata.max_num_logits_per_req, metadata.max_num_reqs_per_rank, metadata.tp_size
    carried = _carried(local_output)
    sources = metadata.gathered_src_indices
    local_rows = row_sources = None
    gathered_fields = {}
    for name, spec in extension_fields.items():
        per_request = spec.per == "request"
        num_send_rows = per_rank * (1 if per_request else width)
        send = torch.zeros((num_send_rows, *spec.shape), dtype=spec.dtype, device=device)
        value = carried.get(name)
        if value is not None and value.shape[0] > 0:
            if per_request:
                send[: value.shape[0]] = value  # a view is read by its strides
            else:
                local_rows = _rows_in_wire(local_cu_np, width, device) if local_rows is None else local_rows
                send[local_rows] = value
        received = torch.empty((tp * num_send_rows, *spec.shape), dtype=spec.dtype, device=device)
        comm.all_gather_into_tensor(received, send)
        if not per_request and row_sources is None:
            row_sources = _gathered_rows(global_cu_np, sources, width)
        gathered_fields[name] = received[sources if per_request else row_sources]
    return gathered_fields


def _carried(local_output: SamplerOutput | None) -> dict:
    extensions = None if local_output is None else getattr(local_output, "extensions", None)
    return extensions or {}


def _owner_and_pos(cu_np: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[L] request of each logits row and the row's position in it."""
    cu = np.asarray(cu_np)  # int32 or int64: the positions come out int64 either way (arange is int64)
    owner = np.repeat(np.arange(cu.shape[0] - 1), np.diff(cu))
    return owner, np.arange(int(cu[-1])) - cu[owner]


def _rows_in_wire(local_cu_np: np.ndarray, width: int, device) -> torch.Tensor:
    """[L_local] send row of each local logits row: local request j's p-th row goes to j * W + p."""
    owner, pos = _owner_and_pos(local_cu_np)
    return torch.from_numpy(owner * width + pos).to(device)


def _gathered_rows(global_cu_np: np.ndarray, src_indices: torch.Tensor, width: int) -> torch.Tensor:
    """[L] row of each batch logits row in the rank-major gathered per-row buffer."""
    owner, pos = _owner_and_pos(global_cu_np)
    device = src_indices.device
    return src_indices[torch.from_numpy(owner).to(device)] * width + torch.from_numpy(pos).to(device)
