"""Per-case results: the ranks' records combined, group checks applied."""

from __future__ import annotations

from typing import Any

from shardspec.conformance.judge.checks.base import GROUP_CHECKERS, checkers_for, group_judgeable
from shardspec.conformance.judge.rank import group_checks, violation_dict
from shardspec.conformance.record import ERROR, FAIL, PASS, CaseResult
from shardspec.spec.case import Case


def combine(case: Case, impl: str, records: dict[int, dict[str, Any]], ended: str | None = None) -> CaseResult:
    """Combine the per-rank records of ``case`` (rank -> record).

    ``ended`` explains missing ranks: why their process stopped.
    """
    errors = _rank_errors(case, records, ended)
    violations = [v for rank in sorted(records) for v in records[rank].get("violations", [])]
    complete = len(records) == case.tp_size and all("digest" in r for r in records.values())
    judged: list[str] = []
    if complete and not errors:
        digests = {rank: records[rank]["digest"] for rank in sorted(records)}
        violations += [violation_dict(v) for v in group_checks(case, digests)]
        per_rank = [set(records[rank].get("judged", ())) for rank in sorted(records)]
        group = {i for i in checkers_for(GROUP_CHECKERS, case.rules) if group_judgeable(i, case, digests)}
        judged = sorted(set.union(*per_rank) | group) if per_rank else []
    status = ERROR if errors else (FAIL if violations else PASS)
    judged = sorted(set(judged) | {v["invariant_id"] for v in violations})  # a violation was judged, errors or not
    return CaseResult(
        case=case,
        impl=impl,
        status=status,
        violations=violations,
        errors=errors,
        timings=_max_timings(records),
        judged=judged,
    )


def _rank_errors(case: Case, records: dict[int, dict[str, Any]], ended: str | None) -> list[dict[str, Any]]:
    """Own failures first: an error inside a collective may just follow a peer's failure."""
    errors = [
        error
        for rank in range(case.tp_size)
        if (error := _rank_error(rank, records.get(rank), f": {ended}" if ended else "")) is not None
    ]
    if any(e["kind"] in ("harness", "raised", "timeout", "died", "mismatch", "undecodable") for e in errors):
        # Missing ranks were stopped because another rank failed.
        for error in errors:
            if error["kind"] == "no-result":
                error["kind"] = "stopped"
    return sorted(errors, key=lambda e: (ERROR_ORDER[e["kind"]], e["rank"]))


# Errors in the order they are listed: the suite's own, then a rank's own failure, then what may follow one.
ERROR_ORDER = {
    "harness": -2,
    "mismatch": -1,
    "raised": 0,
    "died": 0,
    "undecodable": 0,
    "timeout": 1,
    "no-result": 2,
    "peer-timeout": 3,
    "peer": 4,
    "stopped": 5,
}


def _rank_error(rank: int, record: dict[str, Any] | None, why_ended: str) -> dict[str, Any] | None:
    """The error of one rank's record (None: it has none); ``why_ended`` says why missing ranks stopped."""
    if record is None:
        return _error(rank, "no-result", f"rank {rank} produced no result{why_ended}")
    step = record.get("step")
    if record.get("mismatch"):
        return _error(rank, "mismatch", f"{record['mismatch']}: the ranks' collectives disagree", step=step)
    if record.get("undecodable"):
        return _error(rank, "undecodable", record["undecodable"], step=step)
    if record.get("died"):
        return _error(rank, "died", record["died"], step=step)
    if record.get("stopped") and not record.get("error"):
        return _error(rank, "stopped", f"rank {rank} was stopped {record['stopped']}{why_ended}")
    if record.get("harness_error"):
        return _error(rank, "harness", "the conformance suite failed", traceback=record["harness_error"])
    if record.get("timeout"):
        kind = "peer-timeout" if record.get("in_collective") else "timeout"
        return _error(rank, kind, record["timeout"], step=step)
    if record.get("peer_lost"):
        return _error(rank, "peer", record["peer_lost"], step=record.get("peer_lost_step"))
    if record.get("error"):
        error = record["error"]
        message = f"{error['type']} in step {error['step']}: {error['message']}"
        kind = "peer" if error.get("in_collective") else "raised"
        return _error(rank, kind, message, step=error["step"], traceback=error.get("traceback", ""))
    return None


def _error(rank: int, kind: str, message: str, **where: Any) -> dict[str, Any]:
    """An error entry: the rank and kind, the step where one is known, the message, a traceback where given."""
    error: dict[str, Any] = {"rank": rank, "kind": kind}
    if "step" in where:
        error["step"] = where["step"]
    error["message"] = message
    if "traceback" in where:
        error["traceback"] = where["traceback"]
    return error


def _max_timings(records: dict[int, dict[str, Any]]) -> dict[str, float]:
    """Per step, the slowest rank (what the group waits for)."""
    timings: dict[str, float] = {}
    for record in records.values():
        for step, seconds in record.get("timings", {}).items():
            timings[step] = max(timings.get(step, 0.0), seconds)
    return timings
