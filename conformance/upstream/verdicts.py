"""The verdicts of ``python -m shardspec.conformance upstream PATH --behaviour``: which values of each rule of
spec/rules.py a run of vLLM's sharder (behaviour.py) is consistent with, which bundled profiles match,
and the report and its text.

Each rule of spec/rules.py gets the values consistent with what was seen:

- read directly where the step shows it: ``owner`` from each case's ``gathered_src_indices`` (row //
  max_num_reqs_per_rank is the owner) against every value's owners; ``empty_batch_padding`` from an empty
  batch's ``max_num_reqs_per_rank``; ``local_dtypes`` from the local ``idx_mapping``'s dtype against the
  batch's; ``exchange`` and ``adaptive_verification`` from the module's API; ``acceptable_drafts`` from
  whether the code touches ``num_acceptable_drafts`` (drift.py's reading, handed in);
- otherwise from the invariants that hold only for some values of the rule (their ``requires``): a value
  is broken when such an invariant failed under a profile with that value, counted only under profiles
  whose every rule read directly fits the run (under another owner rule every local field differs,
  whatever this rule's value); the values left are those consistent with the run;
- ``logprob_width`` and ``communicator`` show in no step: any value is consistent.

A profile matches when each of its rule values is consistent. Exit 0 when one matches, 1 when none does.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field

import numpy as np

from shardspec.spec import rule_meanings
from shardspec.spec.case import Case
from shardspec.spec.loader import load_spec
from shardspec.spec.profiles import behaviour_profiles
from shardspec.spec.rules import GUARANTEE_RULES, RULES, RULES_BY_NAME, Rules

# Rules no step shows: the engine chooses the logprob width before the gather; either communicator issues
# one all-to-all on the TP group.
NOT_OBSERVABLE = {
    "logprob_width": "the engine's choice of logprobs_dims, not the sharder's",
    "communicator": "either value is one all-to-all on the TP group",
    **{rule: "a guarantee of the caller (what the engine sends), not the sharder's" for rule in GUARANTEE_RULES},
}


@dataclass
class Verdict:
    rule: str
    values: tuple[str, ...]  # the values consistent with the run
    how: str  # how they were found
    broken: dict[str, list[str]] = field(default_factory=dict)  # value -> what failed under it


def _supported(rule: str) -> tuple[str, ...]:
    spec_rule = RULES_BY_NAME[rule]
    return tuple(v for v in spec_rule.values if v not in spec_rule.unsupported)


def _owners(case: Case, value: str) -> list[int]:
    return rule_meanings.owners(value, case.slots, case.tp_size)


def _readable_owners() -> tuple[str, ...]:
    """The owner rules a plan can be read against: owner_table's owners are the engine's table, an input
    this run does not pass (with the initial table they would be slot_mod_tp's, told apart by nothing)."""
    return tuple(v for v in _supported("owner") if v != "owner_table")


def read_owner(cases: dict[str, Case], seen: dict[str, dict]) -> Verdict | None:
    planned = {
        cid: (np.asarray(s["metadata"].gathered_src_indices.cpu()) // max(s["metadata"].max_num_reqs_per_rank, 1))
        for cid, s in seen.items()
        if cases[cid].slots
    }
    if not planned:
        return None  # no plan came back: the invariants decide
    values = tuple(
        v for v in _readable_owners() if all(list(o) == _owners(cases[cid], v) for cid, o in planned.items())
    )
    apart = sum(len({tuple(_owners(cases[cid], v)) for v in _readable_owners()}) > 1 for cid in planned)
    return Verdict(
        "owner", values, f"read off gathered_src_indices in {len(planned)} cases, {apart} telling them apart"
    )


def read_padding(cases: dict[str, Case], seen: dict[str, dict]) -> Verdict | None:
    padded = {int(s["metadata"].max_num_reqs_per_rank) for cid, s in seen.items() if not cases[cid].slots}
    if not padded:
        return None
    empty = [0]  # no rank owns a request
    values = tuple(
        v for v in rule_meanings.EMPTY_BATCH_PADDING if padded <= set(rule_meanings.reqs_per_rank_choices(v, empty))
    )
    return Verdict("empty_batch_padding", values, f"an empty batch pads to {sorted(padded)} request(s) per rank")


def read_dtypes(seen: dict[str, dict]) -> Verdict | None:
    pairs = {(str(s["batch_idx_dtype"]), str(s["local_idx_dtype"])) for s in seen.values()}
    if not pairs or all(b == "torch.int32" for b, _ in pairs):
        return None  # an int32 batch does not tell the two apart
    values = (
        ("batch",)
        if all(b == loc for b, loc in pairs)
        else ("fixed",)
        if all(loc == "torch.int32" for _, loc in pairs)
        else ()
    )
    shown = ", ".join(f"{b} -> {loc}" for b, loc in sorted(pairs))
    return Verdict("local_dtypes", values, f"the local idx_mapping's dtype from the batch's: {shown}")


def read_api(batch_shard) -> list[Verdict]:
    exchange = "all_to_all_vocab_shards" if hasattr(batch_shard, "all_to_all_vocab_shards") else "all_to_all_logits"
    takes = "adaptive_verification_enabled" in inspect.signature(batch_shard.BatchSharder).parameters
    return [
        Verdict("exchange", (exchange,), f"the module has {exchange}()"),
        Verdict(
            "adaptive_verification",
            ("present",) if takes else ("absent",),
            f"BatchSharder {'takes' if takes else 'does not take'} adaptive_verification_enabled",
        ),
    ]


def by_invariants(rule: str, results: list, read: dict[str, Verdict], spec) -> Verdict:
    """The values of ``rule`` not broken by an invariant that holds only for some of its values. Only the
    cases of a profile whose every rule read directly is consistent count: under another owner rule, say,
    every local field differs, whatever this rule's value."""
    broken: dict[str, list[str]] = {}
    held: set[str] = set()
    tied = {inv.id for inv in spec.invariants if rule in dict(inv.requires)}
    for result in results:
        rules = result.case.rules
        if any(getattr(rules, r) not in verdict.values for r, verdict in read.items()):
            continue
        failed = {v["invariant_id"] for v in result.violations} & tied
        for inv in sorted(failed):
            broken.setdefault(getattr(rules, rule), []).append(f"{inv} in {result.case_id}")
        if tied & set(result.judged) - failed:
            held.add(getattr(rules, rule))
    values = tuple(v for v in _supported(rule) if v not in broken)
    how = f"by {', '.join(sorted(tied)) or 'no invariant'}; held under {', '.join(sorted(held)) or 'no value'}"
    return Verdict(rule, values, how, broken)


def read_touches(touched: set[tuple[str, str]]) -> Verdict:
    """``acceptable_drafts`` from the code: whether it touches GrammarOutput.num_acceptable_drafts (the field
    check's reading of the source, drift.py: the stand-ins' GrammarOutput has the field whatever the file
    does, so running it cannot tell)."""
    sliced = ("GrammarOutput", "num_acceptable_drafts") in touched
    said = "touches" if sliced else "never touches"
    return Verdict("acceptable_drafts", ("sliced",) if sliced else ("none",), f"the code {said} num_acceptable_drafts")


def verdicts(cases: list[Case], results: list, seen: dict, batch_shard, touched: set, spec) -> dict[str, Verdict]:
    by_id = {c.case_id: c for c in cases}
    read = {v.rule: v for v in [read_owner(by_id, seen), read_padding(by_id, seen), read_dtypes(seen)] if v}
    read.update({v.rule: v for v in [*read_api(batch_shard), read_touches(touched)]})
    out = {}
    for rule in RULES:
        if rule.name in read:
            out[rule.name] = read[rule.name]
        elif rule.name in NOT_OBSERVABLE:
            out[rule.name] = Verdict(rule.name, _supported(rule.name), "not observable: " + NOT_OBSERVABLE[rule.name])
        else:
            out[rule.name] = by_invariants(rule.name, results, read, spec)
    return out


def matching(found: dict[str, Verdict], profiles: list[Rules]) -> dict[str, list[str]]:
    """Profile -> the rules whose value it sets is not consistent with the run (empty: it matches)."""
    return {p.profile: [r for r, v in found.items() if getattr(p, r) not in v.values] for p in profiles}


# ------------------------------------------------------------------ the report


def report(done, profiles: list[Rules], touched: set[tuple[str, str]], spec=None) -> dict:
    """The verdicts of ``done``'s cases (a behaviour.Run) under ``profiles`` (the others' cases are left
    out, as if hidden); ``touched``: the (class, field) pairs the code touches (drift.py's reading of it)."""
    spec = load_spec() if spec is None else spec
    names = [rules.profile for rules in profiles]
    cases = [c for c in done.cases if c.profile in names]
    results = [r for r in done.results if r.case.profile in names]
    seen = {cid: s for cid, s in done.seen.items() if any(c.case_id == cid for c in cases)}
    found = verdicts(cases, results, seen, done.batch_shard, touched, spec)
    differ = matching(found, profiles)
    under: dict[str, list] = {p: [] for p in names}  # the results of the cases run under each profile
    for result in results:
        under[result.case.profile].append(result)
    per_profile = {}
    for p, mine in under.items():
        failed = {v["invariant_id"] for r in mine for v in r.violations} | (
            {"run-error"} if any(r.errors for r in mine) else set()
        )
        per_profile[p] = {
            "cases": len(mine),
            "failing": sum(r.status != "pass" for r in mine),
            "invariants": sorted(failed),
        }
    return {
        "source": done.label,
        "profiles": names,
        "hidden": [p for p in behaviour_profiles() if p not in names],
        "tp_sizes": sorted({c.tp_size for c in done.cases}),
        "seconds": done.seconds,
        "per_profile": per_profile,
        "rules": {r: {**dataclasses.asdict(v), "values": list(v.values)} for r, v in found.items()},
        "differ": differ,
        "matches": [p for p, rules in differ.items() if not rules],
        "exit_code": 0 if any(not rules for rules in differ.values()) else 1,
    }


def render(report: dict) -> str:
    cases = sum(p["cases"] for p in report["per_profile"].values())
    lines = [
        f"{report['source']}: {cases} cases at tp {', '.join(map(str, report['tp_sizes']))} under "
        f"{', '.join(report['profiles'])} ({report['seconds']} s)"
        + (f"; hidden: {', '.join(report['hidden'])}" if report["hidden"] else "")
    ]
    for profile, seen in report["per_profile"].items():
        failing = ", ".join(seen["invariants"]) or "-"
        lines.append(f"  under {profile}: {seen['failing']} of {seen['cases']} cases fail ({failing})")
    lines.append("rules:")
    for rule, verdict in report["rules"].items():
        lines.append(f"  {rule}: {_rule_line(rule, verdict, report)}")
    if report["matches"]:
        lines.append(f"matches: {', '.join(report['matches'])}")
    else:
        closest = min(report["differ"], key=lambda p: len(report["differ"][p]))
        lines.append(
            f"no bundled profile matches; closest {closest} (differs in {', '.join(report['differ'][closest])})"
        )
    return "\n".join(lines)


def _rule_line(rule: str, verdict: dict, report: dict) -> str:
    values = verdict["values"]
    having = [p for p in report["profiles"] if rule not in report["differ"][p]]  # its value is one of values
    if not values:
        said = "no value of spec/rules.py fits"
    elif set(values) == set(_supported(rule)):
        said = "any value" if verdict["how"].startswith("not observable") else "not told apart"
    else:
        said = " or ".join(f"{v} ({RULES_BY_NAME[rule].values[v]})" for v in values)
    broken = "; ".join(f"{v} broken: {', '.join(why[:3])}" for v, why in verdict["broken"].items())
    where = f"{', '.join(having)} {'has' if len(having) == 1 else 'have'} it" if having else "no bundled profile has it"
    return f"{said} [{verdict['how']}]{'; ' + broken if broken else ''}; {where}"
