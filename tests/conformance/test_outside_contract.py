"""Cases outside a profile's contract (spec/guarantees.py): not run, listed apart with the guarantee each breaks;
sent only by a robustness run, whose findings never fail it; and judged under vllm-0.34-strict."""

import json

from shardspec.conformance.broken import CORPUS
from shardspec.conformance.broken import cases as targeted
from shardspec.conformance.cases.input_space import input_space
from shardspec.conformance.cases.multistep import multi_step_cases
from shardspec.conformance.cases.strategies import generate_cases
from shardspec.conformance.cli import main
from shardspec.conformance.harness.crashes import invalid_input
from shardspec.fixtures import load_case
from shardspec.fixtures.catalogue import with_profile
from shardspec.spec.guarantees import broken_guarantee
from shardspec.spec.profiles import rules_of
from shardspec.spec.rules import GUARANTEE_RULES

# One fixture per guarantee vllm-0.34's callers keep, and one they send.
OUTSIDE = {
    "tp2-reject-slot-unique": "preconditions: trusted: the inputs break PRE-SLOT-UNIQUE",
    "tp2-undefined-host-device-match": "preconditions: trusted: the inputs break PRE-HOST-DEVICE-MATCH",
    "tp2-valid-strided-inputs": "layouts: contiguous: cu_num_logits passed as a strided view",
    "tp2-extensions": "extension_fields: none: extension fields declared",
    "tp2-valid-idx-mapping-np-int32": "dtypes: engine: idx_mapping_np in int32",
}
CHECKS_NOTHING = "shardspec.conformance.broken.rejection:ChecksNothing"


def _run(tmp_path, *args, cases=(*OUTSIDE, "tp2-decode")):
    report = tmp_path / "r.json"
    argv = ["--in-process", "--no-shrink", "--json", str(report), *args]
    code = main(argv + [arg for case_id in cases for arg in ("--case", case_id)])
    return code, json.loads(report.read_text())


def test_a_trusting_profile_lists_what_its_callers_never_send_apart_and_runs_none_of_it(tmp_path, capsys):
    code, report = _run(tmp_path)
    out = capsys.readouterr().out
    assert code == 0 and report["exit_code"] == 0, out[-3000:]
    assert [c["case_id"] for c in report["sections"][0]["cases"]] == ["tp2-decode"]
    listed = {entry["case_id"]: entry for entry in report["outside_contract"]}
    assert set(listed) == set(OUTSIDE)
    for case_id, breach in OUTSIDE.items():
        guarantee = listed[case_id]["guarantee"]
        assert f"{guarantee['rule']}: {guarantee['value']}: {guarantee['what']}".startswith(breach)
        assert listed[case_id]["tp"] == 2
        assert f"{breach}" in out and case_id in out
    assert "outside the contract of profile vllm-0.34 (5 case(s)" in out and "not run; --robustness" in out
    assert report["robustness"] == [] and "robustness findings" not in out


def test_robustness_findings_never_fail_the_run_and_the_strict_profile_fails_the_same_defect(tmp_path, capsys):
    """A sharder that checks nothing: under vllm-0.34 with --robustness its must-reject cases are findings
    (exit 0); under vllm-0.34-strict, where the sharder enforces the preconditions, the same run fails."""
    cases = ("tp2-reject-slot-unique", "tp2-decode")
    code, report = _run(tmp_path, "--impl", CHECKS_NOTHING, "--robustness", cases=cases)
    out = capsys.readouterr().out
    assert code == 0 and report["exit_code"] == 0, out[-3000:]
    assert [c["case_id"] for c in report["sections"][0]["cases"]] == ["tp2-decode"]
    (finding,) = report["robustness"]
    assert finding["case_id"] == "tp2-reject-slot-unique" and finding["status"] in ("fail", "error")
    assert finding["guarantee"]["rule"] == "preconditions"
    assert "robustness findings (1 of 1 case(s) outside the contract" in out
    assert "[preconditions: trusted: the inputs break PRE-SLOT-UNIQUE]" in out
    code, report = _run(tmp_path, "--impl", CHECKS_NOTHING, "--profile", "vllm-0.34-strict", cases=cases)
    assert code == 1 and report["outside_contract"] == [] and report["robustness"] == []


def test_the_strict_profile_judges_every_case_and_the_bundled_implementations_pass(tmp_path, capsys):
    code, report = _run(tmp_path, "--impl", "reference,production", "--profile", "vllm-0.34-strict")
    assert code == 0, capsys.readouterr().out[-3000:]
    assert report["outside_contract"] == []
    for section in report["sections"]:
        assert {c["case_id"]: c["status"] for c in section["cases"]} == dict.fromkeys((*OUTSIDE, "tp2-decode"), "pass")


def test_the_generators_draw_only_what_the_profiles_callers_send():
    """Under vllm-0.34 no generated or multi-step case breaks a guarantee and its input space has no strided
    view, no dtype vLLM never passes and no extension field; under vllm-0.34-strict they are drawn."""
    for profile, strict in (("vllm-0.34", False), ("vllm-0.34-strict", True)):
        rules = rules_of(profile)
        made = generate_cases(2, 12, 0, rules_of(profile)) + multi_step_cases(2, 1, 0, rules_of(profile))
        assert [c.case_id for c in made if broken_guarantee(c, rules)] == []
        keys = {v.key for v in input_space(rules_of(profile))}
        assert ("batch.seq_lens:layout=strided" in keys) is strict
        assert ("batch.idx_mapping:dtype=int32" in keys) is strict
        assert ("extension_fields:presence=present" in keys) is strict
        assert "batch.seq_lens:layout=offset" in keys and "batch.expanded_idx_mapping:dtype=int64" in keys
        views = {layout for c in made for layout in c.layouts.values()}
        assert ("strided" in views) is strict


def test_each_guarantee_has_broken_sharders_judged_only_where_the_profile_owes_it():
    """For each guarantee rule, corpus entries whose targeted cases break it under vllm-0.34: they run (and
    are caught, tests/meta/test_suite_rejects_broken.py) under vllm-0.34-strict only, never under vllm-0.34,
    whose callers never send those cases."""
    trusting = rules_of("vllm-0.34")
    by_rule: dict[str, set[str]] = {}
    for entry in CORPUS:
        breaches = [broken_guarantee(targeted.BY_ID[case_id], trusting) for case_id in entry.cases]
        for breach in filter(None, breaches):
            by_rule.setdefault(breach.rule, set()).add(entry.name)
            assert "vllm-0.34" not in entry.profiles and "vllm-0.34-strict" in entry.profiles, entry
    assert set(by_rule) == set(GUARANTEE_RULES), by_rule
    assert {"checks-nothing", "seq-lens-unit-stride", "drops-extension-field"} <= set().union(*by_rule.values())


def test_a_robustness_runs_crashes_stop_only_cases_outside_the_contract():
    """The crash budget counts a crash on a case outside the contract with the invalid-input ones: a sharder
    that aborts on strided views in a robustness run still runs every case its callers send."""
    strided = load_case("tp2-valid-strided-inputs", "vllm-0.34")
    assert invalid_input(strided) and not invalid_input(load_case("tp2-decode", "vllm-0.34"))
    assert not invalid_input(with_profile(strided, rules_of("vllm-0.34-strict")))
