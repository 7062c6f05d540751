"""A run with generated cases also checks every precondition boundary once (cases/boundaries.py), each at
one of the run's group sizes; a failing boundary case is reproduced from its written file, not shrunk."""

import json
import shlex

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.cases import boundaries as bounds
from shardspec.conformance.cli import main
from shardspec.conformance.run.collect import cases_of_entry, collect_cases
from shardspec.conformance.run.config import RunConfig
from shardspec.spec.profiles import rules_of

BROKEN = "shardspec.conformance.broken.input_space:NegativeSlotsAccepted"


def _boundary_ids(profile: str) -> set[str]:
    made = [b for b in bounds.boundaries(rules_of(profile)) if b.key in bounds.REALIZERS]
    return {f"{b.pre.removeprefix('PRE-').lower()}-at-{b.slug}" for b in made}


def test_a_run_draws_each_boundary_once_at_one_of_its_sizes_and_the_mixed_entry_none():
    """In a robustness run, which sends what the profile's callers never do (sizes where every boundary has one
    in the run: tp 1 too where the construction rule refuses a group of one, vllm-0.33's PRE-TP-SIZE)."""
    for profile, sizes in (("vllm-0.33", [1, 2, 4]), ("vllm-seed", [2, 4])):
        config = RunConfig(tp_sizes=sizes, max_examples=1, rules=rules_of(profile), robustness=True)
        case_set = collect_cases(config)
        at_boundaries = [c for c in case_set.cases if c.case_id in case_set.boundary]
        assert sorted(c.case_id.split("-reject-", 1)[1] for c in at_boundaries) == sorted(_boundary_ids(profile))
        assert {c.tp_size for c in at_boundaries} == set(sizes)
        assert not case_set.boundary & case_set.generated  # the shrinker's set holds only generated cases
        for tp in sizes:
            mixed = cases_of_entry(config, ImplChoice.parse("reference/production"), case_set, tp)
            assert not {c.case_id for c in mixed} & case_set.boundary
            alone = cases_of_entry(config, ImplChoice.parse("reference"), case_set, tp)
            assert {c.case_id for c in alone} >= {c.case_id for c in at_boundaries if c.tp_size == tp}


def test_a_profile_that_trusts_its_caller_draws_no_boundary_its_callers_never_send():
    """vllm-seed builds a sharder for any group, so none of its boundaries is a construction refusal: none is
    drawn; vllm-0.33's and vllm-0.34's runs draw PRE-TP-SIZE's at tp 1 and PRE-CAPACITY-TP's (the construction
    rule's, judged under every profile), and no other."""
    assert collect_cases(RunConfig(tp_sizes=[2, 4], max_examples=1, rules=rules_of("vllm-seed"))).boundary == set()
    for profile in ("vllm-0.33", "vllm-0.34"):
        drawn = collect_cases(RunConfig(tp_sizes=[1, 2], max_examples=1, rules=rules_of(profile)))
        assert {c.split("-reject-", 1)[0] for c in drawn.boundary} == {"tp1", "tp2"}, profile
        assert all("-reject-tp-size" in c or "-reject-capacity-tp" in c for c in drawn.boundary), profile


def test_no_boundary_case_without_generated_cases():
    for config in (RunConfig(tp_sizes=[2], max_examples=0), RunConfig(tp_sizes=[2], fixtures_only=True)):
        assert collect_cases(config).boundary == set()


def test_an_implementation_accepting_a_negative_slot_fails_its_boundary_case_and_it_reproduces(tmp_path):
    report = tmp_path / "r.json"
    args = ["--in-process", "--impl", BROKEN, "--tp", "2", "--max-examples", "1", "--json", str(report)]
    args += ["--profile", "vllm-0.34-strict"]  # whose sharder rejects what breaks a precondition
    assert main([*args, "--run-dir", str(tmp_path / "run")]) == 1
    cases = json.loads(report.read_text())["sections"][0]["cases"]
    [failing] = [c for c in cases if c["status"] == "fail"]
    assert failing["case_id"] == "tp2-reject-slot-range-at-idx-mapping-below-1", failing["case_id"]
    assert {v["invariant_id"] for v in failing["violations"]} == {"INV-REJECT-INVALID"}
    assert not failing["generated"] and not failing.get("shrunk")
    command = shlex.split(failing["reproduce"])
    assert command[command.index("--case-file") + 1].endswith(f"{failing['case_id']}.yaml") and "--tp" in command
    assert command[command.index("--profile") + 1] == "vllm-0.34-strict"  # judged under the run's profile
    again = tmp_path / "again.json"
    assert main([*command[3:], "--json", str(again)]) == 1
    [case] = json.loads(again.read_text())["sections"][0]["cases"]
    assert case["case_id"] == failing["case_id"] and case["status"] == "fail"
