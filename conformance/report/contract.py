"""The cases outside the profile's contract, listed apart, and what a robustness run found in them.

A case that breaks a guarantee of the profile's callers (spec/guarantees.py) is no verdict on an
implementation: the run does not send it and the report lists it with the guarantee it breaks. A
robustness run (``--robustness``) sends it anyway; a crash, a hang or a wrong output there is a robustness
finding, reported here and in the JSON's ``robustness``, never in the table, the failures or the exit status.
"""

from __future__ import annotations

from typing import Any

from shardspec.conformance.record import ERROR, FAIL, CaseResult
from shardspec.spec.guarantees import Breach

# Case ids shown per guarantee on the terminal (the JSON lists every one).
SHOWN_IDS = 6


def outside_lines(outside: dict[str, Breach], profile: str, robustness: bool) -> list[str]:
    """The terminal's list of the cases outside the contract, one line per guarantee broken alike."""
    if not outside:
        return []
    sent = "sent by --robustness: see its findings" if robustness else "not run; --robustness sends them"
    lines = [f"outside the contract of profile {profile} ({len(outside)} case(s) its callers never send; {sent}):"]
    by_breach: dict[str, list[str]] = {}
    for case_id, breach in outside.items():
        by_breach.setdefault(str(breach), []).append(case_id)
    for breach, ids in sorted(by_breach.items()):
        ids = sorted(ids)
        more = f" and {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else ""
        lines.append(f"  {breach}: {', '.join(ids[:SHOWN_IDS])}{more}")
    return lines


def findings(results: dict[str, list[CaseResult]]) -> list[CaseResult]:
    """The robustness run's results that crashed, hung or gave a wrong output."""
    return [r for rs in results.values() for r in rs if r.outside and r.status in (FAIL, ERROR)]


def robustness_lines(results: dict[str, list[CaseResult]]) -> list[str]:
    """The terminal's robustness findings, one line per case (the reproduce command below it)."""
    sent = [r for rs in results.values() for r in rs if r.outside]
    if not sent:
        return []
    found = findings(results)
    lines = [
        f"robustness findings ({len(found)} of {len(sent)} case(s) outside the contract, sent by --robustness; "
        "not conformance failures):"
    ]
    for result in found:
        lines.append(f"  {result.impl}: case {result.case_id} (tp {result.tp}) [{result.outside}]: {_what(result)}")
        lines.append(f"    reproduce: {result.reproduce}")
    return lines


def _what(result: CaseResult) -> str:
    if result.status == ERROR:
        who = lambda e: "the judge" if e["rank"] is None else f"rank {e['rank']}"  # noqa: E731
        kinds = sorted({f"{who(e)} {e['kind']}" for e in result.errors})
        return f"the run failed ({', '.join(kinds)})"
    invariants = sorted({v["invariant_id"] for v in result.violations})
    return f"wrong output ({', '.join(invariants)})"


def json_part(
    outside: dict[str, Breach], tp_of: dict[str, int], results: dict[str, list[CaseResult]]
) -> dict[str, Any]:
    """The JSON report's ``outside_contract`` (every case, with its guarantee) and ``robustness`` (each
    finding of a robustness run)."""
    return {
        "outside_contract": [
            {"case_id": case_id, "tp": tp_of.get(case_id), "guarantee": _breach_json(breach)}
            for case_id, breach in sorted(outside.items())
        ],
        "robustness": [
            {
                "implementation": r.impl,
                "case_id": r.case_id,
                "tp": r.tp,
                "status": r.status,
                "guarantee": _breach_json(outside[r.case_id]) if r.case_id in outside else r.outside,
                "invariants": sorted({v["invariant_id"] for v in r.violations}),
                "errors": [{k: e.get(k) for k in ("rank", "kind", "message")} for e in r.errors],
                "reproduce": r.reproduce,
            }
            for r in findings(results)
        ],
    }


def _breach_json(breach: Breach) -> dict[str, str]:
    return {"rule": breach.rule, "value": breach.value, "what": breach.what}
