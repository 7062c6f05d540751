"""The checkers' field tables (conformance/judge/checks/fields.py) name fields of the data model, each as
what the data model declares it: a path with a typo would compare None with None and pass everything."""

import types
import typing

import numpy as np
import pytest
import torch

from shardspec.conformance.judge.checks import RANK_CHECKERS
from shardspec.conformance.judge.checks.fields import (
    ARRAY,
    BOOL,
    FIELD_TABLES,
    INT,
    INT_LIST,
    LAYOUT,
    PRESENCE,
    STEP_OUTPUTS,
    STR_LIST,
    TENSOR,
)
from shardspec.conformance.record import StepOutputs

DECLARED_AS = {
    TENSOR: torch.Tensor,
    LAYOUT: torch.Tensor,
    ARRAY: np.ndarray,
    INT: int,
    BOOL: bool,
    INT_LIST: list[int],
    STR_LIST: list[str],
}
FIELDS = [(table.invariant_id, field) for table in FIELD_TABLES.values() for field in table.fields]


def _declared(path: str) -> tuple[typing.Any, bool]:
    """The type the data model declares for ``path`` and whether it may be None."""
    names = path.split(".")
    holder: typing.Any = StepOutputs
    if names[0] not in STEP_OUTPUTS:
        names = ["shard", *names]
    optional = False
    for name in names:
        hints = typing.get_type_hints(holder)
        assert name in hints, f"{path}: {holder.__name__} has no field {name}"
        declared = hints[name]
        if isinstance(declared, types.UnionType) or typing.get_origin(declared) is typing.Union:
            members = [t for t in typing.get_args(declared) if t is not type(None)]
            optional = len(members) < len(typing.get_args(declared))
            [declared] = members
        holder = declared
    return holder, optional


@pytest.mark.parametrize("invariant_id, field", FIELDS, ids=[f"{i}:{f.path}" for i, f in FIELDS])
def test_a_table_field_is_a_data_model_field_of_its_kind(invariant_id, field):
    declared, optional = _declared(field.path)
    if field.kind == PRESENCE:
        assert optional and isinstance(declared, type), f"{field.path} is no object that may be None"
    else:
        assert declared == DECLARED_AS[field.kind], f"{field.path} is declared {declared}, compared as {field.kind}"
    if field.none_when is not None:
        assert optional, f"{field.path} may not be None in the data model"


def test_every_table_belongs_to_a_rank_checker():
    assert set(FIELD_TABLES) <= set(RANK_CHECKERS)
