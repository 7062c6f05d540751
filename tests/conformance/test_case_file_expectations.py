"""A case named on the command line is checked against the reference before it is judged, and what a case
cannot judge reads n/a, never pass.

Before, a case file whose ``expect_error`` named a precondition the reference does not raise switched every
checker off, yet every cell read ``pass``: an implementation that sends requests to the wrong ranks passed
a user's own regression case.
"""

import json
from dataclasses import replace

import pytest
from harness_cases import small_cases

from shardspec.conformance.cli import main
from shardspec.fixtures import case_to_yaml

WRONG_OWNERS = "shardspec.conformance.broken.shard:OwnerBySlotDivision"


def _write(case, folder):
    path = folder / f"{case.case_id}.yaml"
    path.write_text(case_to_yaml(case))
    return str(path)


def test_an_expected_error_the_reference_does_not_raise_is_refused(tmp_path, capsys):
    path = _write(replace(small_cases(2)[2], case_id="mine", expect_error="PRE-CAPACITY-REQS"), tmp_path)
    report = tmp_path / "r.json"
    code = main(["--impl", WRONG_OWNERS, "--in-process", "--case-file", path, "--json", str(report)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert "case mine" in err and "PRE-CAPACITY-REQS" in err and "the reference does not raise it" in err, err
    assert not report.exists()


def test_an_error_the_case_does_not_expect_is_refused(tmp_path, capsys):
    # Five requests in a sharder of four: the reference rejects PRE-CAPACITY-REQS.
    case = replace(small_cases(2)[2], case_id="mine", max_num_reqs=2)
    path = _write(case, tmp_path)
    assert main(["--in-process", "--case-file", path]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "case mine" in err and "expects no error" in err and "PRE-CAPACITY-REQS" in err, err


def test_a_step_of_a_multi_step_case_is_checked_too(tmp_path, capsys):
    first, second = small_cases(2)[:2]
    case = replace(first, case_id="steps", then=[replace(second, case_id="ignored", expect_error="PRE-SLOT-RANGE")])
    path = _write(case, tmp_path)
    assert main(["--in-process", "--case-file", path]) == 2
    err = capsys.readouterr().err.strip()
    assert "case steps.step1" in err and "PRE-SLOT-RANGE" in err, err


def test_a_case_that_agrees_with_the_reference_still_runs(tmp_path, capsys):
    paths = [_write(small_cases(2)[0], tmp_path)]
    rejected = replace(small_cases(2)[2], case_id="rejected", max_num_reqs=2, expect_error="PRE-CAPACITY-REQS")
    paths.append(_write(rejected, tmp_path))
    args = [arg for path in paths for arg in ("--case-file", path)]
    assert main(["--in-process", "--profile", "vllm-0.34-strict", *args]) == 0, capsys.readouterr()


@pytest.mark.parametrize("impl", ["reference", WRONG_OWNERS])
def test_invariants_a_rejection_case_cannot_judge_read_na(tmp_path, impl):
    """A case whose inputs are rejected judges the rejection (and that the inputs stay unchanged), nothing of
    the outputs it never produced: those cells read n/a and the JSON does not list them as judged."""
    report = tmp_path / "r.json"
    args = ["--impl", impl, "--in-process", "--profile", "vllm-0.34-strict", "--case", "tp2-reject-batch-size"]
    code = main([*args, "--json", str(report)])
    assert code == 0
    section = json.loads(report.read_text())["sections"][0]
    (case,) = section["cases"]
    assert set(case["judged"]) == {"INV-REJECT-INVALID", "INV-INPUTS-UNCHANGED"}, case["judged"]
    cells = {row["invariant"]: row["results"]["2"] for row in section["table"]}
    for invariant in ("INV-OWNER", "INV-GATHER-SAMPLED-IDS", "INV-RANK-AGREEMENT", "INV-WIRE-SEQUENCE"):
        assert cells[invariant] == "n/a", (invariant, cells[invariant])
    assert cells["INV-REJECT-INVALID"] == "pass"


def test_the_shrinker_keeps_no_variant_the_reference_contradicts():
    """A shrunk case is written for --case-file to reproduce: a variant --case-file would refuse is never
    kept, whatever the implementation does with it."""
    from shardspec.conformance.cases.shrink import signature
    from shardspec.conformance.record import FAIL, CaseResult
    from shardspec.conformance.replay import agreeing

    ran = []

    def failing(case):
        ran.append(case.case_id)
        violation = {"invariant_id": "INV-OWNER", "message": "...", "rank": 0, "request": None, "field": None}
        return CaseResult(case, "x", FAIL, violations=[violation])

    run = agreeing(failing, "cpu")
    contradicted = replace(small_cases(2)[0], case_id="contradicted", expect_error="PRE-CAPACITY-REQS")
    assert signature(run(contradicted)) == set() and ran == []
    assert signature(run(small_cases(2)[0])) == {"INV-OWNER"} and ran == [small_cases(2)[0].case_id]


def test_every_fixture_agrees_with_the_reference():
    """--case checks a fixture as --case-file checks a file: every golden case must pass that check."""
    from shardspec.conformance.harness.expectations import contradiction
    from shardspec.conformance.run.collect import _expanded
    from shardspec.fixtures import load_cases
    from shardspec.spec.profiles import PROFILES

    steps = [step for profile in PROFILES for step in _expanded(load_cases(profile))[0]]
    problems = [problem for step in steps if (problem := contradiction(step, 60.0, "cpu"))]
    assert steps and not problems, problems
