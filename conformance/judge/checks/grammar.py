"""The local grammar output: the owned requests' ids and bitmask rows."""

from __future__ import annotations

from collections.abc import Iterable

from shardspec.conformance.judge.checks.base import StepRecord, Violation, rank_check
from shardspec.conformance.judge.checks.common import check_int_list, check_str_list, check_tensor, fmt, found, shards

FIELD = "local_grammar_output"


@rank_check("INV-LOCAL-GRAMMAR")
def check_local_grammar(record: StepRecord) -> Iterable[Violation]:
    pair = shards(record)
    if pair is None:
        return
    actual, expected = pair[0].local_grammar_output, pair[1].local_grammar_output
    position = {req_id: i for i, req_id in enumerate(record.inputs.batch.req_ids)}
    if expected is None or actual is None:
        if actual is not expected:
            got = None if actual is None else fmt(list(actual.structured_output_request_ids))
            want = None if expected is None else fmt(list(expected.structured_output_request_ids))
            yield Violation(
                "INV-LOCAL-GRAMMAR",
                f"{FIELD} lists {got}, expected {want} (None when the grammar "
                "output is None or lists no owned request)",
                rank=record.rank,
                field=FIELD,
            )
        return
    got, want = actual.structured_output_request_ids, list(expected.structured_output_request_ids)

    def entry_request(entry: int):
        listed = want if entry < len(want) else list(got)
        return position.get(listed[entry]) if entry < len(listed) else None

    violation = check_str_list(
        "INV-LOCAL-GRAMMAR", record, f"{FIELD}.structured_output_request_ids", got, want, entry_request
    )
    if violation:
        violation.message += " (the owned ids in the grammar output's order)"
        yield violation
        return
    # Bitmask row r belongs to the listed request whose rows (or block, in vllm-0.33) cover r.
    row_request = [position[req_id] for req_id in want for _ in range(_rows_of(record, position[req_id]))]
    violation = check_tensor(
        "INV-LOCAL-GRAMMAR",
        record,
        f"{FIELD}.grammar_bitmask",
        actual.grammar_bitmask,
        expected.grammar_bitmask,
        lambda row: row_request[row] if row < len(row_request) else None,
    )
    if violation:
        yield violation
        return
    if record.rules.acceptable_drafts == "sliced":
        yield from _acceptable_drafts(record, actual, expected, [position[req_id] for req_id in want])


def _acceptable_drafts(record: StepRecord, actual, expected, requests: list[int]) -> Iterable[Violation]:
    """acceptable_drafts sliced: num_acceptable_drafts moves with the ids (None stays None)."""
    field = f"{FIELD}.num_acceptable_drafts"
    got, want = getattr(actual, "num_acceptable_drafts", None), expected.num_acceptable_drafts
    if want is None or got is None:
        if got is not want:
            yield Violation(
                "INV-LOCAL-GRAMMAR",
                f"{field} is {fmt(got)}, expected {fmt(want)} (None when the grammar output's is None)",
                rank=record.rank,
                field=field,
            )
        return
    yield from found(
        check_int_list(
            "INV-LOCAL-GRAMMAR", record, field, got, want, lambda k: requests[k] if k < len(requests) else None
        )
    )


def _rows_of(record: StepRecord, request: int) -> int:
    grammar = record.inputs.grammar
    blocks = record.rules.grammar_blocks
    if blocks and grammar is not None and grammar.structured_output_request_ids:
        return grammar.grammar_bitmask.shape[0] // len(grammar.structured_output_request_ids)
    cu = record.inputs.batch.cu_num_logits_np
    return int(cu[request + 1] - cu[request])
