"""Coverage as a report (report/input_coverage.py): every output says which variations of the input space
the cases that ran drew, per entry and tp, and which none drew; a mixed entry's few generated cases are
those that draw the most (cases/spread.py)."""

import json

import pytest
from harness_cases import small_cases, write_cases

from shardspec.conformance.cases.coverage import coverage, exercised
from shardspec.conformance.cases.input_space import input_space, pairs_left_out
from shardspec.conformance.cases.spread import best_spread, drawn
from shardspec.conformance.cli import main
from shardspec.conformance.record import CaseResult, not_run
from shardspec.conformance.report.input_coverage import input_coverage, left_out_lines, summary_lines
from shardspec.conformance.report.matrix import build_matrix
from shardspec.conformance.report.model import ReportError, load_report, parse_report
from shardspec.spec.loader import load_spec
from shardspec.spec.profiles import DEFAULT_PROFILE, rules_of


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("coverage")
    files = write_cases(small_cases(2) + small_cases(3)[:1], folder)
    report = folder / "r.json"
    args = ["--in-process", "--json", str(report), *[a for path in files for a in ("--case-file", path)]]
    return main(args), report


def test_the_json_says_per_tp_what_the_cases_drew_and_what_they_did_not(small_run, capsys):
    code, path = small_run
    assert code == 0
    [section] = json.loads(path.read_text())["sections"]
    space = {v.key for v in input_space(rules_of(DEFAULT_PROFILE))}
    for tp, cases in ((2, small_cases(2)), (3, small_cases(3)[:1])):
        entry = section["input_coverage"][str(tp)]
        expected = coverage(cases, rules_of(DEFAULT_PROFILE))
        assert entry["variations"] == len(space) and entry["covered"] == len(expected.covered) > 0
        assert set(entry["not_covered"]) == {v.key for v in expected.not_covered} and set(entry["not_covered"]) < space
        drawn_once = {v.key for v in exercised(cases[0])}
        assert all(entry["counts"][key] >= 1 for key in drawn_once)


def test_the_terminal_names_each_entry_and_what_no_case_drew(tmp_path, capsys):
    files = write_cases(small_cases(2)[:1], tmp_path)
    assert main(["--in-process", "--case-file", files[0]]) == 0
    out = capsys.readouterr().out
    [line] = [line for line in out.splitlines() if line.startswith("input coverage, reference:")]
    assert "tp 2 " in line and f"/{len(input_space(rules_of(DEFAULT_PROFILE)))}" in line
    missing = [v.key for v in coverage(small_cases(2)[:1], rules_of(DEFAULT_PROFILE)).not_covered]
    assert f"  not drawn at tp 2 ({len(missing)}): {', '.join(missing[:8])} and {len(missing) - 8} more" in out


def test_the_terminal_names_the_pairs_left_out_once_per_run_not_once_per_entry(tmp_path, capsys):
    files = write_cases(small_cases(2)[:1], tmp_path)
    assert main(["--in-process", "--impl", "reference,production", "--case-file", files[0]]) == 0
    lines = capsys.readouterr().out.splitlines()
    entries = [i for i, line in enumerate(lines) if line.startswith("input coverage, ")]
    [left] = [i for i, line in enumerate(lines) if "left out of the space on purpose" in line]
    assert len(entries) == 2 and left > entries[-1]  # after both entries' lines, not under each
    assert lines[left] == left_out_lines([{2: {"left_out": pairs_left_out(rules_of(DEFAULT_PROFILE))}}])[0]


def test_a_case_not_run_draws_nothing():
    [case] = small_cases(2)[:1]
    ran = CaseResult(case=case, impl="reference", status="pass")
    assert (
        input_coverage([not_run(case, "reference", "interrupted")], [2], rules_of(DEFAULT_PROFILE))[2]["covered"] == 0
    )
    assert input_coverage([ran], [2], rules_of(DEFAULT_PROFILE))[2]["covered"] == len(
        coverage([case], rules_of(DEFAULT_PROFILE)).covered
    )
    lines = summary_lines("reference", input_coverage([ran], [2], rules_of(DEFAULT_PROFILE)))
    assert lines[0].startswith("input coverage, reference: tp 2 ") and lines[1].startswith("  not drawn at tp 2")


def test_the_html_matrix_shows_each_column_and_lists_what_was_not_drawn(small_run):
    _, path = small_run
    matrix = build_matrix([load_report(path)], load_spec())
    cells = {(c.column.implementation, c.column.tp): c for c in matrix.coverage}
    report = json.loads(path.read_text())["sections"][0]["input_coverage"]
    for tp in (2, 3):
        cell = cells[("reference", tp)]
        assert cell.text == f"{report[str(tp)]['covered']}/{report[str(tp)]['variations']}"
        assert cell.not_covered == tuple(report[str(tp)]["not_covered"]) and cell.detail_id


def test_a_report_before_input_coverage_reads_not_in_this_report_and_a_bad_one_is_named(small_run):
    _, path = small_run
    data = json.loads(path.read_text())
    del data["sections"][0]["input_coverage"]
    matrix = build_matrix([parse_report(data, "old.json", "old")], load_spec())
    assert {c.text for c in matrix.coverage} == {"not in this report"}
    data["sections"][0]["input_coverage"] = {"2": {"variations": "many"}}
    with pytest.raises(ReportError, match=r"sections\[0\]\.input_coverage\['2'\] has no integer"):
        parse_report(data, "bad.json", "bad")


def test_the_spread_picks_the_cases_that_draw_what_is_not_drawn_yet():
    cases = small_cases(2)
    already = drawn(cases[:1])
    new = [len(drawn([c]) - already) for c in cases]
    [picked] = best_spread([[c] for c in cases], 1, already)
    assert new[picked] == max(new) and new[picked] > 0
    assert best_spread([[c] for c in cases], 2, drawn(cases)) == [0, 1]  # nothing new: the earliest
    assert best_spread([[c] for c in cases], 5, set()) == [0, 1, 2]


@pytest.mark.parametrize("admitted", [None, [0, 2, 1]])
def test_nan_counts_as_drawn_only_in_a_row_that_is_sampled(admitted):
    from dataclasses import replace

    from shardspec.spec.case import Case, build_case_inputs

    base = Case(case_id="nan-rows", tp_size=2, slots=[4, 1, 3], num_logits_per_req=[3, 3, 3], vocab_size=128)
    if admitted is not None:  # the device rows are 1 + admitted, not the scheduled 3 (CL-ADMITTED-DRAFTS)
        base = replace(base, rules=rules_of(DEFAULT_PROFILE), admitted_drafts=admitted)
    indices = build_case_inputs(base).batch.logits_indices.tolist()
    assert [t for tokens in base.sampled_tokens() for t in tokens] == indices
    unsampled = sorted(set(range(max(indices) + 1)) - set(indices))
    assert unsampled, "the layout leaves some tokens unsampled"

    def draws_nan(nan_tokens):
        drawn_here = exercised(replace(base, nan_tokens=nan_tokens))
        return ("logits_shard", "value", "nan") in {(v.field, v.axis, v.value) for v in drawn_here}

    assert not draws_nan(unsampled)
    assert draws_nan(indices[-1:])


def test_every_output_shows_the_pairs_drawn_on_purpose_and_those_left_out(small_run, capsys):
    """A profile's field with each optional output is a variation of the space (the JSON counts it, the terminal
    and the HTML name it where no case drew it); the pairs the space leaves out are listed with why."""
    code, path = small_run
    [section] = json.loads(path.read_text())["sections"]
    entry = section["input_coverage"]["2"]
    profile = json.loads(path.read_text())["metadata"]["profile"]
    cross = [v.key for v in input_space(rules_of(profile)) if "+" in v.field]
    assert cross and all(key in entry["counts"] for key in cross)
    drawn = set(cross) - set(entry["not_covered"])
    assert all(entry["counts"][key] >= 1 for key in drawn) and set(cross) & set(entry["not_covered"])
    left_out = pairs_left_out(rules_of(profile))
    assert entry["left_out"] == left_out and "logits_shard:pair=dtype=float16,value=largest" in left_out
    assert not any("left out" in line for line in summary_lines("reference", {2: entry}))
    [line] = left_out_lines([{2: entry, 3: entry}, {2: entry}])
    assert line.startswith(f"pairs left out of the space on purpose ({len(left_out)}): logits_shard:pair=")
    matrix = build_matrix([load_report(path)], load_spec())
    [note] = [n for n in matrix.notes if "left out of the input space" in n]
    assert all(key in note and why in note for key, why in left_out.items())
    cell = next(c for c in matrix.coverage if c.column.tp == 2)
    assert set(cross) & set(cell.not_covered)
