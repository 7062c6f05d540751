"""Snapshots of a step's inputs and what changed in them since (INV-INPUTS-UNCHANGED)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


def _children(value: Any) -> dict[str, Any] | list[Any] | None:
    """The fields of a dataclass, NamedTuple or dict by name, the items of a list or tuple; None for a leaf."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {name: getattr(value, name) for name in value._fields}
    if isinstance(value, dict):  # e.g. a sampler output's extension fields
        return dict(value)
    if isinstance(value, (list, tuple)):
        return list(value)
    return None


def snapshot(value: Any) -> Any:
    """A deep copy of tensors, arrays, lists, dataclasses and NamedTuples (these two as dicts)."""
    children = _children(value)
    if isinstance(children, dict):
        return {key: snapshot(item) for key, item in children.items()}
    if isinstance(children, list):
        return [snapshot(item) for item in children]
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    return value


def tensors(name: str, value: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(``name.field``, tensor) for every tensor in ``value``, named as :func:`changed_fields` names them."""
    children = _children(value)
    if isinstance(children, dict):
        for key, item in children.items():
            yield from tensors(f"{name}.{key}", item)
    elif isinstance(children, list):
        for i, item in enumerate(children):
            yield from tensors(f"{name}[{i}]", item)
    elif isinstance(value, torch.Tensor):
        yield name, value


def changed_fields(name: str, before: Any, value: Any) -> list[str]:
    """Names (``name.field``) whose contents differ from the snapshot ``before``."""
    return [n for n, b, v in leaves(name, before, value) if not same_value(b, v)]


def leaves(name: str, before: Any, value: Any) -> Iterator[tuple[str, Any, Any]]:
    """(``name.field``, snapshot leaf, current leaf) for each leaf of the snapshot ``before``; a list whose
    length changed is one leaf."""
    if isinstance(before, dict):
        for key, old in before.items():
            item = value.get(key) if isinstance(value, dict) else getattr(value, key, None)
            yield from leaves(f"{name}.{key}", old, item)
    elif isinstance(before, list) and isinstance(value, (list, tuple)) and len(value) == len(before):
        for i, (b, v) in enumerate(zip(before, value, strict=True)):
            yield from leaves(f"{name}[{i}]", b, v)
    else:
        yield name, before, value


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and same_tensor(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    return a == b


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and contents; NaN equals NaN."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b.to(a.device))
