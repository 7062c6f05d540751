"""The local grammar output: the owned requests' ids and bitmask rows."""

from __future__ import annotations

from collections.abc import Iterable

from shardspec.conformance.judge.checks.base import StepRecord, Violation, rank_check
from shardspec.conformance.judge.checks.common import check_str_list, check_tensor, fmt, found, shards

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
    # Bitmask row r belongs to the listed request whose rows cover r.
    row_request = [position[req_id] for req_id in want for _ in range(_rows_of(record, position[req_id]))]
    yield from found(
        check_tensor(
            "INV-LOCAL-GRAMMAR",
            record,
            f"{FIELD}.grammar_bitmask",
            actual.grammar_bitmask,
            expected.grammar_bitmask,
            lambda row: row_request[row] if row < len(row_request) else None,
        )
    )


def _rows_of(record: StepRecord, request: int) -> int:
    cu = record.inputs.batch.cu_num_logits_np
    return int(cu[request + 1] - cu[request])
