"""The per-rank digest the group checkers read.

The digest format is defined once, by :func:`shardspec.conformance.judge.digest.step_digest`
(see its docstring); the group checkers read its keys ``failed_step``,
``wire`` (kind, send_shape, send_dtype, output_shape, input_split_sizes per
collective), ``gathered``, ``sorted_logits_indices`` and ``metadata``.
"""

from __future__ import annotations

from typing import Any

from shardspec.conformance.judge.checks.base import StepRecord
from shardspec.conformance.judge.digest import logprob_rows, step_digest


def rank_digest(record: StepRecord, impl: str = "") -> dict[str, Any]:
    """JSON-able digest of ``record.actual`` for INV-RANK-AGREEMENT and INV-WIRE-SEQUENCE."""
    rows = logprob_rows(record.case, record.inputs.batch)
    return step_digest(record.actual, rank=record.rank, impl=impl, logprob_rows=rows)
