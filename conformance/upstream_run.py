"""``python -m shardspec.conformance upstream PATH --behaviour``: which profile's rules does vLLM's sharder follow?

The field check (upstream.py) reads the code; this runs it. The sharder (``installed``: the vllm package,
through examples/vllm; a ``batch_shard.py``: that file, through examples/upstream_vllm's stand-ins) runs a
few valid generated cases, an empty batch and a batch whose slots and positions name different owners,
under each bundled profile, one process per rank, judged by the suite. Each rule of spec/rules.py then
gets the values consistent with what was seen:

- read directly where the step shows it: ``owner`` from each case's ``gathered_src_indices`` (row //
  max_num_reqs_per_rank is the owner) against every value's owners; ``empty_batch_padding`` from an empty
  batch's ``max_num_reqs_per_rank``; ``local_dtypes`` from the local ``idx_mapping``'s dtype against the
  batch's; ``exchange`` and ``adaptive_verification`` from the module's API; ``acceptable_drafts`` from
  whether the code touches ``num_acceptable_drafts`` (upstream.py's reading, handed in);
- otherwise from the invariants that hold only for some values of the rule (their ``requires``): a value
  is broken when such an invariant failed under a profile with that value, counted only under profiles
  whose every rule read directly fits the run (under another owner rule every local field differs,
  whatever this rule's value); the values left are those consistent with the run;
- ``logprob_width`` and ``communicator`` show in no step: any value is consistent.

A profile matches when each of its rule values is consistent. Exit 0 when one matches, 1 when none does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import pathlib
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace

import numpy as np

from shardspec.spec.case import Case
from shardspec.spec.profiles import PROFILES, rules_of
from shardspec.spec.rules import RULES, RULES_BY_NAME

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
TP_SIZES = (2, 3)
CASES_PER_TP = 3
# Larger generated batches cost seconds each in Triton's interpreter and tell the rules apart no better.
MAX_REQUESTS = 16
# Rules no step shows: the engine chooses the logprob width before the gather; either communicator issues
# one all-to-all on the TP group.
NOT_OBSERVABLE = {
    "logprob_width": "the engine's choice of logprobs_dims, not the sharder's",
    "communicator": "either value is one all-to-all on the TP group",
}


class BehaviourInputError(Exception):
    """Bad input (no such file, vLLM not installed): the one-line message is printed and the exit code is 2."""


@dataclass
class Subject:
    label: str
    impl: str  # --impl of the suite
    folder: pathlib.Path  # the adapter's folder, put on PYTHONPATH
    env: dict[str, str] = field(default_factory=dict)

    @contextlib.contextmanager
    def environment(self):
        """The adapter importable, here and in the rank processes this one starts (the fork launcher's ranks
        import it from this process's path), and the file named; put back as it was afterwards."""
        saved_env, saved_path = dict(os.environ), list(sys.path)
        os.environ.update(self.env)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.folder), os.environ.get("PYTHONPATH")]))
        sys.path.insert(0, str(self.folder))
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved_env)
            sys.path[:] = saved_path

    def batch_shard(self):
        """The module of vLLM's sharder, loaded in this process, for its API."""
        try:
            if "shardspec_vllm" in self.impl:
                import shardspec_vllm

                return shardspec_vllm.batch_shard
            import shardspec_upstream

            return shardspec_upstream.load_upstream(self.env["SHARDSPEC_UPSTREAM_FILE"])
        except Exception as exc:  # an import of vLLM or a load of the file: its first line
            raise BehaviourInputError(f"{self.label}: cannot be loaded: {type(exc).__name__}: {exc}") from None


def subject_of(arg: str) -> Subject:
    if arg == "installed":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise BehaviourInputError("installed: no vllm package is installed (importlib finds none)")
        return Subject("the installed vllm package", "shardspec_vllm:make_sharder", _adapter("vllm"))
    path = pathlib.Path(arg)
    if not path.is_file() or path.suffix != ".py":
        raise BehaviourInputError(f"{arg}: no such file (--behaviour runs installed or a batch_shard.py)")
    env = {"SHARDSPEC_UPSTREAM_FILE": str(path.resolve())}
    return Subject(str(path), "shardspec_upstream:make_sharder", _adapter("upstream_vllm"), env)


def _adapter(name: str) -> pathlib.Path:
    folder = EXAMPLES / name
    if not folder.is_dir():
        raise BehaviourInputError(f"{folder}: no such adapter (--behaviour runs from a checkout of shardspec)")
    return folder


# ------------------------------------------------------------------ the cases


def _plain(case: Case) -> Case | None:
    """``case`` with every input in its plain form (contiguous, the default dtypes, no edits or extension
    fields), or None for a case that must be rejected or whose ranks' outputs leave logprobs out: what every
    release handles, so that what fails is a rule, not one of its known defects."""
    case = replace(case, layouts={}, edits=[], extensions={}, batch_dtypes={})
    outputs = case.local_outputs
    local_logprobs = outputs == "toy" or all(o.logprob_token_ids is not None for o in outputs.values())
    small = 0 < len(case.slots) <= MAX_REQUESTS
    return case if case.expect_error is None and small and local_logprobs else None


def drift_cases(profiles: list[str], tp_sizes=TP_SIZES, per_tp: int = CASES_PER_TP) -> list[Case]:
    """``per_tp`` plain generated cases per group size and an empty batch, under each profile."""
    from shardspec.conformance.cases.strategies import generate_cases

    cases = []
    for profile in profiles:
        for tp in tp_sizes:
            plain = [p for p in map(_plain, generate_cases(tp, per_tp * 2, 0, profile, fill_gaps=False)) if p]
            cases += [replace(c, case_id=f"{profile}-{c.case_id}") for c in plain[:per_tp]]
        empty = Case(f"{profile}-empty-tp2", 2, slots=[], num_logits_per_req=[], profile=profile, logprobs_dims=None)
        # Every request's slot and batch position name different owners: the owner rules are told apart.
        crossed = Case(
            f"{profile}-crossed-tp2", 2, slots=[1, 0, 3, 2], num_logits_per_req=[1, 2, 1, 1], profile=profile
        )
        cases += [empty, crossed]
    return cases


# ------------------------------------------------------------------ the run


def _probing_judge():
    """The suite's judge, keeping what rank 0's shard step returned for each case (the plan is replicated)."""
    from shardspec.conformance.judge.verdicts import Judge
    from shardspec.conformance.replay import suite_judge

    class ProbingJudge(Judge):
        def __init__(self, expect, device, seen):
            super().__init__(expect, device)
            self.seen = seen

        def at(self, device):  # the harness moves the judge to the ranks' device: the plans go on being kept
            return self if device == self.device else ProbingJudge(self.expect, device, self.seen)

        def transcripts(self, case, label, transcripts, ended=None, culprit=None):
            shard = getattr(getattr(transcripts.get(0), "outputs", None), "shard", None)
            if shard is not None:
                self.seen[case.case_id] = {
                    "metadata": shard.metadata,
                    "local_idx_dtype": shard.local_batch.idx_mapping.dtype,
                    "batch_idx_dtype": self.inputs(case).batch.idx_mapping.dtype,
                }
            return super().transcripts(case, label, transcripts, ended, culprit)

    base = suite_judge()
    judge = ProbingJudge(base.expect, base.device, {})
    return judge, judge.seen


def run_cases(subject: Subject, cases: list[Case]) -> tuple[list, dict[str, dict]]:
    """Every case run by ``subject`` one process per rank: the suite's results, and rank 0's plan per case."""
    from shardspec.conformance.api import ImplChoice
    from shardspec.conformance.harness.group import Job
    from shardspec.conformance.harness.multiprocess import LaunchOptions, run_jobs_multiprocess

    judge, seen = _probing_judge()
    results, servers = [], {}
    with tempfile.TemporaryDirectory(prefix="shardspec-drift-") as run_dir:
        options = LaunchOptions(pathlib.Path(run_dir), case_timeout_s=60, pg_timeout_s=30, max_crashes=0)
        try:
            for tp in sorted({c.tp_size for c in cases}):
                jobs = [Job(ImplChoice(subject.impl), c) for c in cases if c.tp_size == tp]
                options = replace(options, run_dir=pathlib.Path(run_dir) / f"tp{tp}")
                results += run_jobs_multiprocess(jobs, tp, options, judge, log=lambda line: None, servers=servers)
        finally:
            for server in servers.values():
                server.close()
    return results, seen


# ------------------------------------------------------------------ the verdicts


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
    return dataclasses.replace(rules_of(case.profile), owner=value).owners(case.slots, case.tp_size)


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
    values = ("one", "zero_or_one") if padded == {1} else ("zero_or_one",) if padded <= {0, 1} else ()
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
        rules = rules_of(result.case.profile)
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
    check's reading of the source, upstream.py: the stand-ins' GrammarOutput has the field whatever the file
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


def matching(found: dict[str, Verdict], profiles: list[str]) -> dict[str, list[str]]:
    """Profile -> the rules whose value it sets is not consistent with the run (empty: it matches)."""
    return {p: [r for r, v in found.items() if getattr(rules_of(p), r) not in v.values] for p in profiles}


# ------------------------------------------------------------------ the check


@dataclass
class Run:
    """What the sharder did: the cases, the suite's results, rank 0's plan per case, the module it ran."""

    label: str
    cases: list[Case]
    results: list
    seen: dict[str, dict]
    batch_shard: object
    seconds: float


def run(arg: str, profiles: list[str]) -> Run:
    """``arg``'s sharder run on :func:`drift_cases` under ``profiles``; BehaviourInputError for bad input."""
    import torch

    subject = subject_of(arg)
    if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
        subject.env["TRITON_INTERPRET"] = "1"  # the kernels run in Triton's interpreter on the CPU
    with subject.environment():
        batch_shard = subject.batch_shard()
        started = time.monotonic()
        cases = drift_cases(profiles)
        results, seen = run_cases(subject, cases)
    return Run(subject.label, cases, results, seen, batch_shard, round(time.monotonic() - started, 1))


def visible_profiles(hidden: tuple[str, ...] = ()) -> list[str]:
    unknown = [p for p in hidden if p not in PROFILES]
    if unknown:
        raise BehaviourInputError(f"--hide-profile {unknown[0]}: no such bundled profile ({', '.join(PROFILES)})")
    profiles = [p for p in PROFILES if p not in hidden]
    if not profiles:
        raise BehaviourInputError("--hide-profile hides every bundled profile: nothing to run the cases under")
    return profiles


def report(done: Run, profiles: list[str], touched: set[tuple[str, str]], spec=None) -> dict:
    """The verdicts of ``done``'s cases under ``profiles`` (the others' cases are left out, as if hidden);
    ``touched``: the (class, field) pairs the code touches (upstream.py's reading of it)."""
    from shardspec.spec.loader import load_spec

    spec = load_spec() if spec is None else spec
    cases = [c for c in done.cases if c.profile in profiles]
    results = [r for r in done.results if r.case.profile in profiles]
    seen = {cid: s for cid, s in done.seen.items() if any(c.case_id == cid for c in cases)}
    found = verdicts(cases, results, seen, done.batch_shard, touched, spec)
    differ = matching(found, profiles)
    under: dict[str, list] = {p: [] for p in profiles}  # the results of the cases run under each profile
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
        "profiles": profiles,
        "hidden": [p for p in PROFILES if p not in profiles],
        "tp_sizes": list(TP_SIZES),
        "seconds": done.seconds,
        "per_profile": per_profile,
        "rules": {r: {**dataclasses.asdict(v), "values": list(v.values)} for r, v in found.items()},
        "differ": differ,
        "matches": [p for p, rules in differ.items() if not rules],
        "exit_code": 0 if any(not rules for rules in differ.values()) else 1,
    }


def check(arg: str, touched: set[tuple[str, str]], hidden: tuple[str, ...] = ()) -> dict:
    """``arg`` (``installed`` or a batch_shard.py) run under every bundled profile but ``hidden``, judged."""
    profiles = visible_profiles(hidden)
    return report(run(arg, profiles), profiles, touched)


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
    having = [p for p in report["profiles"] if getattr(rules_of(p), rule) in values]
    if not values:
        said = "no value of spec/rules.py fits"
    elif set(values) == set(_supported(rule)):
        said = "any value" if verdict["how"].startswith("not observable") else "not told apart"
    else:
        said = " or ".join(f"{v} ({RULES_BY_NAME[rule].values[v]})" for v in values)
    broken = "; ".join(f"{v} broken: {', '.join(why[:3])}" for v, why in verdict["broken"].items())
    where = f"{', '.join(having)} {'has' if len(having) == 1 else 'have'} it" if having else "no bundled profile has it"
    return f"{said} [{verdict['how']}]{'; ' + broken if broken else ''}; {where}"
