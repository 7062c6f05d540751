"""Fields of an engine's batch that the spec does not list reach the local batch unchanged
(INV-LOCAL-UNLISTED-FIELDS)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable

import torch

from shardspec.conformance.judge.checks.base import StepRecord, Violation, rank_check
from shardspec.conformance.judge.checks.common import shards
from shardspec.spec.documents import holds_for
from shardspec.spec.loader import load_spec
from shardspec.spec.model import InputBatch
from shardspec.spec.rules import Rules

INVARIANT = "INV-LOCAL-UNLISTED-FIELDS"


@functools.cache
def listed(rules: Rules) -> frozenset[str]:
    """The InputBatch fields the profile of ``rules`` lists (vLLM 0.33's own are an engine's fields in vllm-seed)."""
    names = {f.name for f in load_spec().data_model.type("InputBatch").fields if holds_for(f, rules)}
    return frozenset(f.name for f in dataclasses.fields(InputBatch) if f.name in names)


def _unlisted(record: StepRecord) -> list[str]:
    batch, names = record.inputs.batch, listed(record.case.rules)
    return [f.name for f in dataclasses.fields(batch) if f.name not in names and getattr(batch, f.name) is not None]


def _has_unlisted_fields(record: StepRecord) -> bool:
    return record.case.expect_error is None and bool(_unlisted(record))


@rank_check(INVARIANT, applies=_has_unlisted_fields)
def check_unlisted_fields(record: StepRecord) -> Iterable[Violation]:
    pair = shards(record)
    batch = record.inputs.batch
    unlisted = _unlisted(record)
    if pair is None or not unlisted:
        return
    local = pair[0].local_batch
    if type(local) is not type(batch):
        yield Violation(
            INVARIANT,
            f"the local batch is a {type(local).__name__}, expected the batch's own type {type(batch).__name__}",
            rank=record.rank,
            field="local_batch",
        )
        return
    for name in unlisted:
        if not _same(getattr(local, name, None), getattr(batch, name)):
            yield Violation(
                INVARIANT,
                f"field {name} is {getattr(local, name, None)!r}, expected the batch's "
                f"{getattr(batch, name)!r} carried over unchanged",
                rank=record.rank,
                field=f"local_batch.{name}",
            )
            return


def _same(actual, expected) -> bool:
    """Equal value, dtype, shape and device for tensors; equality otherwise."""
    if isinstance(expected, torch.Tensor):
        return (
            isinstance(actual, torch.Tensor)
            and actual.dtype == expected.dtype
            and actual.shape == expected.shape
            and actual.device == expected.device
            and bool(torch.equal(actual, expected))
        )
    return actual == expected
