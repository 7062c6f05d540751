"""Errors that name the part of the contract an input violates."""

from __future__ import annotations


class PreconditionError(ValueError):
    """An input violates precondition ``precondition_id`` of the spec.

    The message names the precondition, the field, and where known the batch
    position of the request and the rank that detected it.
    """

    def __init__(
        self,
        precondition_id: str,
        field: str,
        message: str,
        *,
        request: int | None = None,
        rank: int | None = None,
    ):
        self.precondition_id = precondition_id
        self.field = field
        self.request = request
        self.rank = rank
        where = [f"field {field}"]
        if request is not None:
            where.append(f"request {request}")
        if rank is not None:
            where.append(f"rank {rank}")
        super().__init__(f"[{precondition_id}] {message} ({', '.join(where)})")


class SpecFileError(ValueError):
    """A spec or fixture file is malformed: names the file, place and field."""

    def __init__(self, path: str, place: str, message: str):
        self.path = path
        self.place = place
        super().__init__(f"{path}: at {place}: {message}")


def names_precondition(error: BaseException | None, precondition_id: str) -> bool:
    """Whether ``error`` names ``precondition_id``: as its attribute (PreconditionError) or in its message
    (an implementation's own exception type)."""
    return error is not None and (
        getattr(error, "precondition_id", None) == precondition_id or precondition_id in str(error)
    )


def declines_extensions(extensions, error: BaseException | None) -> bool:
    """Whether ``error`` refuses a case's extension fields with PRE-EXTENSION-SUPPORTED, which the spec
    allows (INV-GATHER-EXTENSIONS judges where and how): a verdict, not a run error."""
    return bool(extensions) and names_precondition(error, "PRE-EXTENSION-SUPPORTED")
