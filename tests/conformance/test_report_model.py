"""The HTML report's data: reading JSON reports, the matrix's cells, the diff between runs.

run-v1.json and run-v2.json (tests/conformance/data, recorded by record.sh) are two runs of one
implementation, ``regression_adapter:make_sharder``: conforming in v1, owners computed wrongly in v2
(plus tp 3 judged only in v2); ``reference/production`` runs in both and passes.
run-v1-legacy-format.json is v1 in the format written before reports counted judgements.
"""

import json
import pathlib

import pytest

from shardspec.conformance.report.matrix import (
    NEWLY_FAILING,
    NEWLY_JUDGED,
    NEWLY_PASSING,
    NO_LONGER_JUDGED,
    OTHER_GROUP,
    Column,
    build_matrix,
    diff_runs,
    diff_sections,
    make_cell,
)
from shardspec.conformance.report.model import ReportError, load_report, parse_report, parse_verdict, report_names
from shardspec.conformance.report.summary import ERRORS_ROW, NOT_RUN_ROW
from shardspec.spec.loader import load_spec

DATA = pathlib.Path(__file__).parent / "data"
ADAPTER = "regression_adapter:make_sharder"
MIXED = "reference/production"


@pytest.fixture(scope="module")
def spec():
    return load_spec()


@pytest.fixture(scope="module")
def runs():
    return [load_report(DATA / "run-v1.json"), load_report(DATA / "run-v2.json")]


def _cell(matrix, invariant_id, report, implementation, tp):
    row = next(r for r in matrix.rows if r.invariant_id == invariant_id)
    return next(c for c in row.cells if c.column == Column(report, implementation, tp))


# -- verdicts and reading ---------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, verdict, count",
    [
        ("pass", "pass", None),
        ("FAIL", "fail", None),
        ("FAIL 6", "fail", 6),
        ("xfail 2", "xfail", 2),
        ("warn", "warn", None),
        ("n/a", "n/a", None),
        ("not-run", "not-run", None),
        ("0", "pass", 0),
        ("3", "fail", 3),
        ("flaky", "unknown", None),
        ("", "unknown", None),
    ],
)
def test_verdicts_as_the_report_writes_them(raw, verdict, count):
    cell = parse_verdict(raw)
    assert (cell.verdict, cell.count, cell.text) == (verdict, count, raw)


def test_a_cell_given_as_a_mapping_carries_its_judged_count():
    cell = parse_verdict({"verdict": "FAIL", "judged": 12})
    assert (cell.verdict, cell.judged) == ("fail", 12)


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not JSON (Expecting value at line 1"),
        ("[1, 2]", "not a conformance report (no 'sections' list at the top level)"),
        ('{"sections": {}}', "no 'sections' list"),
        ('{"sections": [{"tp_sizes": [2], "table": []}]}', "sections[0].implementation is missing"),
        (
            '{"sections": [{"implementation": "x", "tp_sizes": ["two"], "table": []}]}',
            "sections[0].tp_sizes is not a list of integers",
        ),
        (
            '{"sections": [{"implementation": "x", "tp_sizes": [2], "table": [{"results": {}}]}]}',
            "sections[0].table[0] has no 'invariant'",
        ),
        (
            '{"sections": [{"implementation": "x", "tp_sizes": [2], "table": [{"invariant": "I", "results": {"tp2": '
            '"pass"}}]}]}',
            "has a key 'tp2' that is not a tp size",
        ),
        (
            '{"sections": [{"implementation": "x", "tp_sizes": [2], "table": [], "cases": [{"tp": 2}]}]}',
            "sections[0].cases[0].case_id is missing",
        ),
        (
            '{"sections": [{"implementation": "x", "tp_sizes": [2], "table": [], "cases": [{"case_id": "c", "tp": 2, '
            '"violations": [{"message": "m"}]}]}]}',
            "violations is not a list of violations with an 'invariant_id'",
        ),
    ],
)
def test_bad_reports_are_named_in_one_line(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ReportError) as error:
        load_report(path)
    text = str(error.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_a_missing_report_is_named(tmp_path):
    with pytest.raises(ReportError, match=r"nowhere\.json: no such file"):
        load_report(tmp_path / "nowhere.json")


def test_report_names_stay_distinct():
    assert report_names(["a/run.json", "b/run.json", "c.json"]) == ["a/run", "b/run", "c"]
    assert report_names(["run.json", "run.json"]) == ["run (1)", "run (2)"]


# -- the matrix --------------------------------------------------------------------------


def test_rows_are_the_spec_grouped_by_step_then_the_run(spec, runs):
    matrix = build_matrix(runs, spec)
    live = [inv for inv in spec.invariants if not inv.retired]
    assert [r.invariant_id for r in matrix.rows] == [
        *[i.id for step in ("shard", "all_to_all", "gather", "step") for i in live if i.step == step],
        *[i.id for i in live if i.step not in ("shard", "all_to_all", "gather", "step")],
        ERRORS_ROW,
        NOT_RUN_ROW,
    ]
    assert [g.title for g in matrix.groups][:4] == ["shard", "all-to-all", "gather", "the whole step"]
    owner = next(r for r in matrix.rows if r.invariant_id == "INV-OWNER")
    assert owner.level == "MUST" and owner.statement.startswith("Batch request i is owned by rank")
    # two runs x two entries; v1 ran tp 1, 2 and v2 tp 1, 2, 3
    assert len(matrix.columns) == 10 and all(len(r.cells) == 10 for r in matrix.rows)


def test_cells_carry_verdict_judged_count_and_failing_cases(spec, runs):
    matrix = build_matrix(runs, spec)
    owner = _cell(matrix, "INV-OWNER", "run-v2", ADAPTER, 2)
    # three cases at tp 2, one of which ended in an error: two judged INV-OWNER (the report's count)
    assert (owner.verdict, owner.judged, owner.failing_count, owner.label) == ("fail", 2, 1, "fail 1/2")
    assert [c.case_id for c in owner.failing] == ["tp2-decode"] and owner.detail_id
    assert "--case tp2-decode" in owner.failing[0].reproduce
    assert {m.where.split(",")[0] for m in owner.failing[0].messages} == {"rank 0", "rank 1"}
    passing = _cell(matrix, "INV-OWNER", "run-v2", ADAPTER, 1)
    assert (passing.verdict, passing.label, passing.detail_id) == ("pass", "pass 1", None)
    assert _cell(matrix, "INV-OWNER", "run-v2", MIXED, 1).verdict == "n/a"
    rejected = _cell(matrix, "INV-REJECT-INVALID", "run-v2", ADAPTER, 2)
    assert rejected.label == "fail 1/1" and [c.case_id for c in rejected.failing] == ["tp2-error-local-output-rows"]
    # no invalid-input case at tp 1: nothing judged the rejection there
    unjudged = _cell(matrix, "INV-REJECT-INVALID", "run-v2", ADAPTER, 1)
    assert (unjudged.verdict, unjudged.judged, unjudged.label, unjudged.detail_id) == ("n/a", 0, "n/a", None)


def test_judged_counts_are_derived_from_reports_without_them(spec):
    legacy = load_report(DATA / "run-v1-legacy-format.json")  # written before reports counted judgements
    assert all(c.judged is None for s in legacy.sections for c in s.cases)
    matrix = build_matrix([legacy], spec)
    ran = {tp: sum(c.tp == tp and c.status != "not-run" for c in legacy.section(ADAPTER).cases) for tp in (1, 2)}
    for tp in (1, 2):
        cell = _cell(matrix, "INV-OWNER", "run-v1-legacy-format", ADAPTER, tp)
        assert (cell.verdict, cell.judged) == ("pass", ran[tp])


def test_the_errors_row_shows_what_each_rank_raised(spec, runs):
    errors = _cell(build_matrix(runs, spec), ERRORS_ROW, "run-v2", ADAPTER, 2)
    assert (errors.verdict, errors.failing_count, errors.judged) == ("fail", 1, 3)  # 1 of the 3 cases that ran
    case = errors.failing[0]
    assert case.case_id == "tp2-explicit-missing-logprobs"
    assert any(m.where.startswith("rank ") and "Error" in m.text for m in case.messages)


def _synthetic(cell, case_extra=None, invariant="INV-OWNER", level="MUST"):
    case = {
        "case_id": "c1",
        "tp": 2,
        "status": "fail",
        "reproduce": "python -m shardspec.conformance --case c1",
        "violations": [{"invariant_id": invariant, "message": "wrong owner", "rank": 0}],
        **(case_extra or {}),
    }
    return parse_report(
        {
            "metadata": {"spec_version": "0.0.9"},
            "sections": [
                {
                    "implementation": "x",
                    "tp_sizes": [2, 4],
                    "not_applicable": {},
                    "table": [{"invariant": invariant, "level": level, "results": {"2": cell, "4": "n/a"}}],
                    "cases": [case],
                }
            ],
        },
        "synthetic.json",
        "synthetic",
    )


def test_fields_a_report_may_gain_are_used_when_present(spec):
    report = _synthetic(
        {"verdict": "warn", "judged": 40},
        {
            "case_yaml": "case_id: c1\n",
            "violations": [{"invariant_id": "INV-OWNER", "message": "wrong owner", "rank": 0, "level": "SHOULD"}],
        },
    )
    matrix = build_matrix([report], spec)
    cell = _cell(matrix, "INV-OWNER", "synthetic", "x", 2)
    assert (cell.verdict, cell.judged, cell.label) == ("warn", 40, "warn 1/40")
    assert cell.failing[0].case_yaml == "case_id: c1\n" and cell.failing[0].messages[0].level == "SHOULD"
    assert _cell(matrix, "INV-OWNER", "synthetic", "x", 4).verdict == "n/a"
    assert matrix.notes and "0.0.9" in matrix.notes[0]
    # rows the report lacks read not-run, never pass
    assert _cell(matrix, "INV-SPLITS", "synthetic", "x", 2).label == "not-run"


def test_a_case_that_reported_a_violation_counts_as_judged_even_if_it_ended_in_an_error(spec):
    """Reports list what a case judged only for cases that completed; an errored case may still
    carry violations (a rank judged before another failed): it counts among the judged."""
    report = _synthetic({"verdict": "FAIL", "judged": 1}, {"judged": ["INV-OWNER"]})
    section = report.sections[0]
    errored = parse_report(
        {
            "sections": [
                {
                    "implementation": "x",
                    "tp_sizes": [2],
                    "table": [],
                    "cases": [
                        {
                            "case_id": "c2",
                            "tp": 2,
                            "status": "error",
                            "judged": [],
                            "violations": [{"invariant_id": "INV-OWNER", "message": "raised too late", "rank": 0}],
                        }
                    ],
                }
            ]
        },
        "e",
        "e",
    )
    section.cases.append(errored.sections[0].cases[0])
    cell = _cell(build_matrix([report], spec), "INV-OWNER", "synthetic", "x", 2)
    assert (cell.failing_count, cell.judged, cell.label) == (2, 2, "fail 2/2")


def test_a_minimal_case_file_named_by_the_reproduce_command_is_embedded(spec, tmp_path):
    case_file = tmp_path / "failing" / "gen-1-min.yaml"
    case_file.parent.mkdir()
    case_file.write_text("case_id: gen-1-min\ntp_size: 2\n")
    report = _synthetic("FAIL", {"reproduce": f"python -m shardspec.conformance --case-file {case_file} --tp 2"})
    cell = _cell(build_matrix([report], spec), "INV-OWNER", "synthetic", "x", 2)
    assert cell.failing[0].case_yaml == "case_id: gen-1-min\ntp_size: 2\n"
    gone = _synthetic("FAIL", {"reproduce": f"python -m shardspec.conformance --case-file {tmp_path}/gone.yaml"})
    assert _cell(build_matrix([gone], spec), "INV-OWNER", "synthetic", "x", 2).failing[0].case_yaml is None


def test_invariants_the_spec_does_not_list_get_their_own_group(spec):
    matrix = build_matrix([_synthetic("FAIL", invariant="INV-FROM-A-PLUGIN", level="SHOULD")], spec)
    other = next(g for g in matrix.groups if g.title == OTHER_GROUP)
    assert [(r.invariant_id, r.level) for r in other.rows] == [("INV-FROM-A-PLUGIN", "SHOULD")]
    assert other.rows[0].cells[0].verdict == "fail"


def test_a_cell_outside_the_sections_sizes_is_not_applicable_where_the_report_says(runs):
    mixed = runs[0].section(MIXED)
    assert make_cell(mixed, "INV-OWNER", Column("run-v1", MIXED, 1)).text == "a mixed group needs an odd rank"


# -- the diff -----------------------------------------------------------------------------


def _changes(diff, kind):
    return {(c.invariant_id, c.tp): c for c in diff.of_kind(kind)}


def test_the_diff_shows_the_regression(runs):
    diffs = {d.implementation: d for d in diff_runs(runs)}
    assert set(diffs) == {ADAPTER, MIXED}
    regression = diffs[ADAPTER]
    failing = _changes(regression, NEWLY_FAILING)
    assert failing[("INV-OWNER", 2)].new_failing_cases == ("tp2-decode",)
    assert (failing[("INV-OWNER", 2)].old, failing[("INV-OWNER", 2)].new) == ("pass", "fail")
    assert failing[("INV-REJECT-INVALID", 2)].new_failing_cases == ("tp2-error-local-output-rows",)
    assert failing[(ERRORS_ROW, 2)].new_failing_cases == ("tp2-explicit-missing-logprobs",)
    assert ("INV-OWNER", 1) not in failing  # tp 1 has one owner: still passes
    judged = _changes(regression, NEWLY_JUDGED)
    assert ("INV-OWNER", 3) in judged and judged[("INV-OWNER", 3)].old == "absent"
    assert not regression.of_kind(NEWLY_PASSING) and not regression.of_kind(NO_LONGER_JUDGED)
    assert not diffs[MIXED].of_kind(NEWLY_FAILING)


def test_the_diff_backwards_is_the_fix(runs):
    fixed = next(d for d in diff_runs(list(reversed(runs))) if d.implementation == ADAPTER)
    assert ("INV-OWNER", 2) in _changes(fixed, NEWLY_PASSING)
    assert ("INV-OWNER", 3) in _changes(fixed, NO_LONGER_JUDGED)
    assert not fixed.of_kind(NEWLY_FAILING)


def test_only_runs_of_one_implementation_are_compared(runs):
    with pytest.raises(ValueError, match="two runs of one implementation"):
        diff_sections(runs[0].section(ADAPTER), runs[1].section(MIXED), "run-v1", "run-v2")


def test_recorded_reports_are_what_the_tests_assume():
    """Guards the data: re-recording must keep v1 passing and v2 failing."""
    v1, v2 = (json.loads((DATA / f"run-{v}.json").read_text()) for v in ("v1", "v2"))
    assert (v1["exit_code"], v2["exit_code"]) == (0, 1)
