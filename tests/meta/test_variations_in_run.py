"""What callers may send, drawn on purpose: each variation of conformance/broken/variations.py has an entry whose
defect shows only there. The default run's own cases reject each entry by its invariant at every tp, and the
entry passes the targeted cases that do not draw its variation (the generators before drew none of the slots'
relations but by chance, the bound of seq_lens in int32 only, and the owner table only ever fully rewritten
across a step)."""

import ast
import pathlib

import pytest

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.broken import BY_NAME, cases
from shardspec.conformance.broken.cases import TABLE_RULES
from shardspec.conformance.cases.coverage import coverage, exercised
from shardspec.conformance.replay import run_case_in_process
from shardspec.conformance.run import resolve
from shardspec.conformance.run.collect import collect_cases
from shardspec.fixtures.catalogue import with_profile
from shardspec.spec.profiles import DEFAULT_PROFILE, rules_of

# Each variation (its key) and the entry whose defect shows only there.
ENTRIES = {
    "batch.idx_mapping:value=identical": "local-slots-numbered-like-positions",
    "batch.idx_mapping:value=reversed": "reversed-slots-gathered-in-slot-order",
    "batch.idx_mapping:value=permuted": "identity-judged-by-its-ends",
    "batch.idx_mapping:value=gaps": "ascending-slots-taken-as-consecutive",
    "batch.idx_mapping:value=above-n": "slots-rebased-when-all-past-n",
    "batch.seq_lens_cpu_upper_bound:dtype=int64": "upper-bound-localized-in-int32",
}
# Targeted cases that draw each variation but one: an entry passes those that do not draw its own.
OTHERS = (
    "decode",
    "spec",
    "upper-bound-int64",
    "slots-identical",
    "slots-reversed",
    "slots-permuted",
    "slots-gaps",
    "slots-above-n",
)


def _violated(case, entry) -> set[str]:
    return {v["invariant_id"] for v in run_case_in_process(case, ImplChoice(entry.target)).violations}


@pytest.fixture(scope="module")
def default_run():
    """The default run's cases under a profile (the default profile's, or the first of an entry's profiles where
    the default profile's callers never send its variation: the int64 bound, under dtypes: accepted)."""
    made = {}

    def run(entry):
        profile = _profile_of(entry)
        if profile not in made:
            config = resolve.resolve_run({"impl": "reference", "profile": profile}, {}).config
            made[profile] = config, collect_cases(config)
        return made[profile]

    return run


@pytest.mark.parametrize("key", sorted(ENTRIES))
def test_the_default_run_rejects_each_variation_s_entry(default_run, key):
    entry = BY_NAME[ENTRIES[key]]
    config, case_set = default_run(entry)
    sizes = [tp for tp in config.tp_sizes if tp >= rules_of(config.profile).min_tp]
    assert sizes
    for tp in sizes:
        drawing = [
            c for c in case_set.cases if c.tp_size == tp and not c.expect_error and key in {v.key for v in exercised(c)}
        ]
        assert drawing, (key, tp)
        found = [_violated(case, entry) for case in drawing]
        assert any(entry.invariant_id in ids for ids in found), (key, tp, [c.case_id for c in drawing], found)


def _profile_of(entry) -> str:
    """The default profile where ``entry`` runs under it, else its first (whose callers send its variation)."""
    return DEFAULT_PROFILE if DEFAULT_PROFILE in entry.profiles else entry.profiles[0]


@pytest.mark.parametrize("key", sorted(ENTRIES))
def test_only_the_variation_catches_its_entry(key):
    entry = BY_NAME[ENTRIES[key]]
    others = [with_profile(cases.BY_ID[case_id], rules_of(_profile_of(entry))) for case_id in OTHERS]
    drawing = {c.case_id for c in others if key in {v.key for v in exercised(c)}}
    assert set(entry.cases) <= drawing, (key, entry.cases, drawing)
    for case in others:
        if case.case_id not in drawing:
            assert _violated(case, entry) == set(), (key, case.case_id)


# The owner table carried across a step in each form (conformance/cases/owner_tables.py, CARRIED), run by
# `nox -s conformance` under the owner table's profile on noxfile.py's budget: its multi-step case.
CARRIED_ENTRIES = {
    "owner_table:step=rewritten": "rewrite-taken-for-a-fresh-table",
    "owner_table:step=rewritten-in-part": "changed-table-taken-for-a-full-rewrite",
    "owner_table:step=kept": "unchanged-table-rewritten-by-sharder",
}
NOXFILE = pathlib.Path(__file__).resolve().parents[2] / "noxfile.py"


def _nox_budget(profile: str) -> dict[str, str]:
    """--shardspec-tp and --shardspec-max-examples of ``profile``'s run in noxfile.py's EXTRA_PROFILE_RUNS."""
    tree = ast.parse(NOXFILE.read_text())
    runs = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["EXTRA_PROFILE_RUNS"]
    )
    # The owner table's run is its strict variant (a profile file that also sends the must-reject cases).
    run = runs[profile] if profile in runs else runs[f"{profile}-strict"]
    args = dict(zip(run[::2], run[1::2], strict=True))
    return {"tp": args["--shardspec-tp"], "max_examples": args["--shardspec-max-examples"]}


@pytest.fixture(scope="module")
def table_run():
    given = {"impl": "reference", "profile": TABLE_RULES.profile, **_nox_budget(TABLE_RULES.profile)}
    config = resolve.resolve_run(given, {}).config
    return config, collect_cases(config)


@pytest.mark.parametrize("key", sorted(CARRIED_ENTRIES))
def test_the_owner_table_run_rejects_each_carried_form_s_entry(table_run, key):
    config, case_set = table_run
    entry = BY_NAME[CARRIED_ENTRIES[key]]
    multi = {parent.case_id: parent for parent in case_set.parents.values()}.values()
    drawing = [case for case in multi if key in {v.key for v in coverage([case], rules_of(config.profile)).covered}]
    assert drawing, (key, [c.case_id for c in multi])
    found = [_violated(case, entry) for case in drawing]
    assert any(entry.invariant_id in ids for ids in found), (key, found)
    # and the targeted cases of the other forms pass it
    for other, name in CARRIED_ENTRIES.items():
        if other != key:
            case = cases.BY_ID[BY_NAME[name].cases[0]]
            assert key not in {v.key for v in coverage([case], rules_of(config.profile)).covered}
            assert _violated(case, entry) == set(), (key, case.case_id)
