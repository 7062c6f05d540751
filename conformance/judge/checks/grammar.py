"""The local grammar output: the owned requests' ids and bitmask rows."""

from __future__ import annotations

from shardspec.conformance.judge.checks.base import StepRecord
from shardspec.conformance.judge.checks.common import RowToRequest
from shardspec.conformance.judge.checks.fields import INT_LIST, PRESENCE, STR_LIST, TENSOR, Field, field_check

FIELD = "local_grammar_output"


def _positions(record: StepRecord) -> dict[str, int]:
    return {req_id: i for i, req_id in enumerate(record.inputs.batch.req_ids)}


def _listed(record: StepRecord) -> list[str]:
    """The ids the reference's local grammar output lists: the owned ones, in the grammar output's order."""
    return list(record.expected.shard.local_grammar_output.structured_output_request_ids)


def _by_listed_entry(record: StepRecord) -> RowToRequest:
    """Entry k of the listed ids -> its request (past the reference's entries, the one the implementation lists)."""
    position, want = _positions(record), _listed(record)
    got = getattr(record.actual.shard.local_grammar_output, "structured_output_request_ids", None)

    def request(entry: int) -> int | None:
        listed = want if entry < len(want) else ([] if got is None else list(got))
        return position.get(listed[entry]) if entry < len(listed) else None

    return request


def _by_owned_entry(record: StepRecord) -> RowToRequest:
    """Entry k of a per-listed-request field -> the k-th owned request."""
    position = _positions(record)
    requests = [position[req_id] for req_id in _listed(record)]
    return lambda k: requests[k] if k < len(requests) else None


def _by_bitmask_row(record: StepRecord) -> RowToRequest:
    """Bitmask row r -> the listed request whose rows (or block, in vllm-0.33) cover r."""
    position = _positions(record)
    row_request = [position[req_id] for req_id in _listed(record) for _ in range(_rows_of(record, position[req_id]))]
    return lambda row: row_request[row] if row < len(row_request) else None


def _rows_of(record: StepRecord, request: int) -> int:
    grammar = record.inputs.grammar
    if record.rules.grammar_blocks and grammar is not None and grammar.structured_output_request_ids:
        return grammar.grammar_bitmask.shape[0] // len(grammar.structured_output_request_ids)
    cu = record.inputs.batch.cu_num_logits_np
    return int(cu[request + 1] - cu[request])


field_check(
    "INV-LOCAL-GRAMMAR",
    Field(FIELD, PRESENCE, none_when="None when the grammar output is None or lists no owned request"),
    Field(
        f"{FIELD}.structured_output_request_ids",
        STR_LIST,
        _by_listed_entry,
        note=" (the owned ids in the grammar output's order)",
    ),
    Field(f"{FIELD}.grammar_bitmask", TENSOR, _by_bitmask_row),
    # acceptable_drafts sliced: num_acceptable_drafts moves with the ids.
    Field(
        f"{FIELD}.num_acceptable_drafts",
        INT_LIST,
        _by_owned_entry,
        none_when="None when the grammar output's is None",
        when=lambda rules: rules.acceptable_drafts == "sliced",
    ),
)
