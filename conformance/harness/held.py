"""What the caller keeps of a step, watched on the rank (INV-GATHER-RESULT-STABLE, -OWNED).

An engine holds step n's gathered result while step n+1 runs and reuses its own inputs' memory. The
rank reports two things for the judge: the fields of held results whose contents changed during a
later step (with the first changed row), and the tensors of a result that lie in an input's memory.
"""

from __future__ import annotations

from typing import Any

import torch

from shardspec.conformance.harness.snapshots import leaves, same_value, snapshot, tensors


class HeldResults:
    """Every earlier step's gathered result of one sharder, each beside a copy of its contents."""

    def __init__(self):
        self._held: list[tuple[str, Any, Any]] = []  # (case id, the result, its copy)

    def hold(self, case_id: str, gathered, copy: Any = None) -> None:
        """Holds ``gathered`` beside ``copy`` (a snapshot taken when it was returned), or a copy made now."""
        if gathered is not None:
            self._held.append((case_id, gathered, snapshot(gathered) if copy is None else copy))

    def changed(self) -> list[dict[str, Any]]:
        """Each field of a held result whose contents differ from its copy: ``field`` (``<case id>.gathered.<name>``)
        and the first ``row`` that differs (None where the shape changed or there are no rows)."""
        return [
            {"field": name, "row": _first_changed_row(old, new)}
            for case_id, result, copy in self._held
            for name, old, new in leaves(f"{case_id}.gathered", copy, result)
            if not same_value(old, new)
        ]


def _first_changed_row(old: Any, new: Any) -> int | None:
    if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)) or old.dim() == 0:
        return None
    if old.shape != new.shape or old.dtype != new.dtype:
        return None
    new = new.to(old.device)
    differs = old != new
    if old.is_floating_point():
        differs &= ~(old.isnan() & new.isnan())  # NaN for NaN is no change
    rows = differs.reshape(old.shape[0], -1).any(dim=1).nonzero()
    return int(rows[0]) if rows.numel() else None


def shared_memory(name: str, result: Any, inputs: dict[str, Any]) -> list[dict[str, str]]:
    """Each non-empty tensor of ``result`` that lies in the storage of a non-empty tensor of ``inputs``:
    ``{"field": "<name>.<field>", "input": "<input>.<field>"}``. The shard step's outputs are the
    sharder's own and not looked at here."""
    owners = {
        _storage(tensor): field
        for key, value in inputs.items()
        if key != "shard"
        for field, tensor in tensors(key, value)
        if tensor.numel()
    }
    return [
        {"field": field, "input": owners[_storage(tensor)]}
        for field, tensor in tensors(name, result)
        if tensor.numel() and _storage(tensor) in owners
    ]


def _storage(tensor: torch.Tensor) -> tuple[str, int]:
    if tensor.layout != torch.strided or tensor.device.type == "meta":  # no storage of its own to share
        return str(tensor.device), -1 - id(tensor)
    return str(tensor.device), tensor.untyped_storage().data_ptr()
