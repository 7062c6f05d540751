"""Known failures keyed by invariant and properties of the case (an xfails file's `known_failures`)."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from shardspec.conformance.report.summary import (
    ERRORS_ROW,
    InvariantInfo,
    Section,
    table_rows,
)
from shardspec.conformance.report.xfails import load_xfails
from shardspec.spec.case import Case, ExplicitLocalOutput
from shardspec.spec.profiles import rules_of


def _result(case: Case, status="fail", violations=(), generated=False):
    return SimpleNamespace(
        case=case,
        case_id=case.case_id,
        tp=case.tp_size,
        status=status,
        generated=generated,
        violations=[{"invariant_id": i} for i in violations],
        errors=[],
        judged=[],
    )


def _xfails(tmp_path, text):
    path = tmp_path / "xfails.yaml"
    path.write_text(text)
    return load_xfails(str(path))


def _case(case_id, tp=2, slots=(0, 1, 2, 3), profile=None, **fields):
    if profile is not None:
        fields["rules"] = rules_of(profile)
    return Case(case_id=case_id, tp_size=tp, slots=list(slots), num_logits_per_req=[1] * len(slots), **fields)


def test_a_property_entry_covers_exactly_the_cases_with_that_property(tmp_path):
    xfails = _xfails(
        tmp_path,
        "known_failures:\n"
        "  - invariants: [INV-WIRE-SEQUENCE, INV-WIRE-SAMPLED]\n"
        "    when: {tp: 1}\n"
        "    why: spec-choice\n"
        "    reason: one rank, no all-gather\n",
    )
    at_one = _result(_case("gen-tp1-s0-003", tp=1, slots=[0, 1]))
    at_two = _result(_case("gen-tp2-s0-003", tp=2))
    assert xfails.covers("INV-WIRE-SEQUENCE", at_one)
    assert xfails.covers("INV-WIRE-SAMPLED", at_one)
    assert not xfails.covers("INV-WIRE-SEQUENCE", at_two)  # the same invariant at tp 2 still fails
    assert not xfails.covers("INV-OWNER", at_one)  # another invariant of the same case still fails


def test_the_table_marks_a_cell_xfail_only_when_every_failing_case_has_the_property(tmp_path):
    xfails = _xfails(
        tmp_path,
        "known_failures:\n"
        "  - {invariant: INV-LOCAL-CU-NUM-LOGITS, when: {empty_batch: true}, why: vllm-defect,\n"
        "     reason: an empty batch's entry is never written}\n",
    )
    invariants = [InvariantInfo("INV-LOCAL-CU-NUM-LOGITS", "MUST")]
    empty = _result(_case("tp2-empty", slots=[]), violations=["INV-LOCAL-CU-NUM-LOGITS"])
    full = _result(_case("gen-tp2-s0-001"), violations=["INV-LOCAL-CU-NUM-LOGITS"])
    checked = {"INV-LOCAL-CU-NUM-LOGITS"}
    (row, *_) = table_rows(Section("vllm", [empty], [2]), invariants, checked, xfails)
    assert row[2].startswith("xfail")
    (row, *_) = table_rows(Section("vllm", [empty, full], [2]), invariants, checked, xfails)
    assert row[2].startswith("FAIL")


def test_run_errors_are_covered_by_run_error_entries_with_their_property(tmp_path):
    xfails = _xfails(
        tmp_path,
        "known_failures:\n"
        "  - {invariants: [run-error], when: {must_reject: true}, why: spec-choice, reason: no check}\n",
    )
    rejected = _result(_case("tp2-reject-x", expect_error="PRE-BATCH-SIZE"), status="error")
    valid = _result(_case("tp2-valid-x"), status="error")
    rows = table_rows(Section("vllm", [rejected], [2]), [], set(), xfails)
    assert [r for r in rows if r[0] == ERRORS_ROW][0][2].startswith("xfail")
    rows = table_rows(Section("vllm", [rejected, valid], [2]), [], set(), xfails)
    assert [r for r in rows if r[0] == ERRORS_ROW][0][2] == "FAIL 2"
    assert not xfails.covers("", _result(_case("tp2-reject-y", expect_error="PRE-X"), status="not-run"))


@pytest.mark.parametrize(
    ("when", "case", "covered"),
    [
        ("{layout: strided}", _case("a", layouts={"seq_lens": "strided"}), True),
        ("{layout: strided}", _case("a", layouts={"seq_lens": "offset"}), False),
        ("{edit: seq-lens-upper-bound-absent}", _case("a", edits=["seq-lens-upper-bound-absent"]), True),
        ("{absent: [seq_lens_cpu_upper_bound]}", _case("a", edits=["seq-lens-upper-bound-absent"]), True),
        ("{absent: [seq_lens_cpu_upper_bound]}", _case("a"), False),
        ("{present: [grammar]}", _case("a", grammar_positions=[0]), True),
        ("{present: [grammar]}", _case("a"), False),
        ("{absent: [logprobs]}", _case("a", logprobs_dims=None), True),
        # an empty declaration is a declaration: the gather is handed extension_fields={} and owes {} back
        ("{present: [extension_fields]}", _case("a", edits=["extension-fields-declared-empty"]), True),
        ("{absent: [extension_fields]}", _case("a", edits=["extension-fields-declared-empty"]), False),
        ("{absent: [extension_fields]}", _case("a"), True),
        ("{batch_dtype: int32}", _case("a", batch_dtypes={"idx_mapping": "int32"}), True),
        ("{batch_dtype: cu_num_logits=int64}", _case("a", batch_dtypes={"cu_num_logits": "int64"}), True),
        ("{batch_dtype: cu_num_logits=int64}", _case("a", batch_dtypes={"seq_lens": "int64"}), False),
        ("{rejects: PRE-BATCH-SIZE}", _case("a", expect_error="PRE-BATCH-SIZE"), True),
        ("{rejects: [PRE-A, PRE-BATCH-SIZE]}", _case("a", expect_error="PRE-BATCH-SIZE"), True),
        ("{must_reject: false}", _case("a", expect_error="PRE-BATCH-SIZE"), False),
        ("{case: 'tp*-reject-capacity-*'}", _case("tp4-reject-capacity-reqs"), True),
        ("{case: 'tp*-reject-capacity-*'}", _case("tp4-valid-capacity-reqs"), False),
        # slots 0 and 2 at tp 2: both on rank 0 by slot (vllm-0.33), one per rank by position (vllm-0.34)
        ("{rank_owns_nothing: true}", _case("a", slots=[0, 2], profile="vllm-0.33"), True),
        ("{rank_owns_nothing: true}", _case("a", slots=[0, 1], profile="vllm-0.33"), False),
        ("{rank_owns_nothing: true}", _case("a", slots=[0, 2], profile="vllm-0.34"), False),
        ("{rank_owns_nothing: true}", _case("a", slots=[4], profile="vllm-0.34"), True),
        ("{rank_owns_nothing: true, tp: [2, 3]}", _case("a", slots=[0, 2], profile="vllm-0.33"), True),
        (
            "{rank_owns_nothing: true, tp: 3}",
            _case("a", slots=[0, 2], profile="vllm-0.33"),
            False,
        ),  # every property must hold
        # an owner table's entries decide (vllm-0.34-sharded-draft-cache): slots 0 and 1 both on rank 1 here,
        # where slot mod tp or position mod tp would give each rank one
        (
            "{rank_owns_nothing: true}",
            _case("a", slots=[0, 1], profile="vllm-0.34-sharded-draft-cache", owner_table={0: 1}),
            True,
        ),
        ("{rank_owns_nothing: true}", _case("a", slots=[0, 1], profile="vllm-0.34-sharded-draft-cache"), False),
        ("{multi_step: true}", _case("a", continues="a.step0"), True),
        ("{}", _case("a"), True),
    ],
)
def test_each_property(tmp_path, when, case, covered):
    xfails = _xfails(
        tmp_path, f"known_failures:\n  - {{invariant: INV-X, when: {when}, why: vllm-defect, reason: r}}\n"
    )
    assert xfails.covers("INV-X", _result(case)) is covered


def test_the_owner_rule_of_the_case_s_profile_decides_who_owns_nothing(tmp_path):
    xfails = _xfails(
        tmp_path,
        "known_failures:\n  - {invariant: INV-X, when: {rank_owns_nothing: true}, why: vllm-defect, reason: r}\n",
    )
    case = _case("a", slots=[0, 2], profile="vllm-0.33")
    assert xfails.covers("INV-X", _result(case))  # vllm-0.33: slot % tp, both on rank 0
    by_position = replace(case.rules, owner="position_mod_tp")
    # positions 0 and 1: one request per rank
    assert not xfails.covers("INV-X", _result(replace(case, rules=by_position)))


def test_local_logprobs_absent_on_one_rank(tmp_path):
    xfails = _xfails(
        tmp_path,
        "known_failures:\n  - {invariant: INV-X, when: {absent: [local_logprobs]}, why: vllm-defect, reason: r}\n",
    )
    with_lp = ExplicitLocalOutput([[1]], [1], [0], None, [[1, 2]], [[0.0, -1.0]], [0])
    without = ExplicitLocalOutput([[1]], [1], [0])
    assert xfails.covers("INV-X", _result(_case("a", slots=[0, 1], local_outputs={0: with_lp, 1: without})))
    assert not xfails.covers("INV-X", _result(_case("a", slots=[0, 1], local_outputs={0: with_lp, 1: with_lp})))
    assert not xfails.covers("INV-X", _result(_case("a", slots=[0, 1])))  # the toy sampler: logprobs everywhere


def test_an_entry_that_covers_nothing_is_reported_stale_and_id_entries_still_work(tmp_path):
    xfails = _xfails(
        tmp_path,
        "INV-OLD: {kind: spec-choice, why: an id-keyed entry}\n"
        "known_failures:\n"
        "  - {invariant: INV-X, when: {tp: 2}, why: vllm-defect, reason: r}\n"
        "  - {invariant: INV-X, when: {tp: 4}, why: vllm-defect, reason: r}\n"
        "  - {invariant: INV-GONE, why: spec-choice, reason: r}\n",
    )
    assert xfails.covers("INV-OLD", _result(_case("a")))
    assert xfails.covers("INV-X", _result(_case("a")))
    warnings = xfails.warnings({"INV-OLD", "INV-X"}, {"a"})
    assert warnings == [
        "known failure 'INV-X when tp=4' did not fail in this run (remove it?)",
        "known failure 'INV-GONE when any case': INV-GONE is no invariant of this run",
    ]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("{invariant: INV-X, when: {tpp: 2}, why: spec-choice, reason: r}", "unknown property 'tpp'"),
        ("{invariant: INV-X, when: {tp: two}, why: spec-choice, reason: r}", "tp: 'two'"),
        ("{invariant: INV-X, when: {empty_batch: yes please}, why: spec-choice, reason: r}", "empty_batch"),
        ("{invariant: INV-X, when: {absent: [bitmask]}, why: spec-choice, reason: r}", "unknown input 'bitmask'"),
        ("{invariant: INV-X, why: upstream, reason: r}", "why: 'upstream'"),
        ("{invariant: INV-X, why: spec-choice}", "reason"),
        ("{invariant: INV-X, why: spec-choice, reason: r, kind: x}", "unknown key 'kind'"),
        ("{why: spec-choice, reason: r}", "invariants"),
        ("{invariant: INV-X, why: vllm-defect, reason: r, defect: Empty Batch}", "defect: 'Empty Batch'"),
        ("{invariant: INV-X, why: spec-choice, reason: r, defect: empty-batch}", "no defect report"),
    ],
)
def test_a_malformed_entry_is_refused_with_what_is_wrong(tmp_path, item, message):
    with pytest.raises(ValueError, match=message):
        _xfails(tmp_path, f"known_failures:\n  - {item}\n")


@pytest.mark.parametrize("release", ["0.33", "0.34"])
def test_each_vllm_release_s_known_failures_load_and_say_whose_they_are(release):
    from pathlib import Path

    path = Path(__file__).parents[2] / "examples" / "vllm" / f"known_failures_{release}.yaml"
    xfails = load_xfails(str(path))
    assert not xfails.entries  # keyed by property only: no generated case id
    assert xfails.known and {item.why for item in xfails.known} <= {"vllm-defect", "spec-choice"}
