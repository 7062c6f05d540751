"""How the reference's precondition checks report a violation, and the small searches they share.

A violation raises :class:`PreconditionError` naming the precondition ID, the field and, where one
is at fault, the request's batch position (the first one found) and the rank.
"""

from __future__ import annotations

import numpy as np
import torch

from shardspec.spec.errors import PreconditionError

INT_DTYPES = (torch.int32, torch.int64)


def first_bad(mask: np.ndarray) -> int | None:
    """The position of the first True in ``mask``, or None."""
    bad = np.flatnonzero(mask)
    return int(bad[0]) if bad.size else None


def require(cond: bool, pid: str, field: str, message: str, request=None, rank=None) -> None:
    """Raise the precondition ``pid``'s error on ``field`` unless ``cond`` holds."""
    if not cond:
        raise PreconditionError(pid, field, message, request=request, rank=rank)


def check_shape(pid: str, field: str, value, expected: tuple, rank) -> None:
    require(tuple(value.shape) == expected, pid, field, f"shape {tuple(value.shape)}, expected {expected}", rank=rank)


def duplicate_position(items: list) -> int | None:
    """The position of the first item that repeats an earlier one, or None."""
    seen = set()
    for position, item in enumerate(items):
        if item in seen:
            return position
        seen.add(item)
    return None
