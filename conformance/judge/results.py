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
        group = {i for i in checkers_for(GROUP_CHECKERS, case.profile) if group_judgeable(i, case, digests)}
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
    errors = []
    for rank in range(case.tp_size):
        record = records.get(rank)
        if record is None:
            errors.append(
                {
                    "rank": rank,
                    "kind": "no-result",
                    "message": f"rank {rank} produced no result" + (f": {ended}" if ended else ""),
                }
            )
        elif record.get("mismatch"):
            errors.append(
                {
                    "rank": rank,
                    "kind": "mismatch",
                    "step": record.get("step"),
                    "message": f"{record['mismatch']}: the ranks' collectives disagree",
                }
            )
        elif record.get("undecodable"):
            error = {"rank": rank, "kind": "undecodable", "step": record.get("step"), "message": record["undecodable"]}
            errors.append(error)
        elif record.get("died"):
            errors.append({"rank": rank, "kind": "died", "step": record.get("step"), "message": record["died"]})
        elif record.get("stopped") and not record.get("error"):
            errors.append(
                {
                    "rank": rank,
                    "kind": "stopped",
                    "message": f"rank {rank} was stopped {record['stopped']}" + (f": {ended}" if ended else ""),
                }
            )
        elif record.get("harness_error"):
            errors.append(
                {
                    "rank": rank,
                    "kind": "harness",
                    "message": "the conformance suite failed",
                    "traceback": record["harness_error"],
                }
            )
        elif record.get("timeout"):
            kind = "peer-timeout" if record.get("in_collective") else "timeout"
            errors.append({"rank": rank, "kind": kind, "step": record.get("step"), "message": record["timeout"]})
        elif record.get("peer_lost"):
            errors.append(
                {"rank": rank, "kind": "peer", "step": record.get("peer_lost_step"), "message": record["peer_lost"]}
            )
        elif record.get("error"):
            error = record["error"]
            kind = "peer" if error.get("in_collective") else "raised"
            errors.append(
                {
                    "rank": rank,
                    "kind": kind,
                    "step": error["step"],
                    "message": f"{error['type']} in step {error['step']}: {error['message']}",
                    "traceback": error.get("traceback", ""),
                }
            )
    if any(e["kind"] in ("harness", "raised", "timeout", "died", "mismatch", "undecodable") for e in errors):
        # Missing ranks were stopped because another rank failed.
        for error in errors:
            if error["kind"] == "no-result":
                error["kind"] = "stopped"
    order = {
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
    return sorted(errors, key=lambda e: (order[e["kind"]], e["rank"]))


def _max_timings(records: dict[int, dict[str, Any]]) -> dict[str, float]:
    """Per step, the slowest rank (what the group waits for)."""
    timings: dict[str, float] = {}
    for record in records.values():
        for step, seconds in record.get("timings", {}).items():
            timings[step] = max(timings.get(step, 0.0), seconds)
    return timings
