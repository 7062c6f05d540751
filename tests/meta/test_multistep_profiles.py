"""Multi-step cases are built from each profile's own inputs (conformance/cases/multistep.py): every step holds for
the run's profile, and a later step changes what the profile's callers change between steps of the same
requests: the admitted draft counts where it has them, the bound of seq_lens where it has one, and where its
engine may leave the bound out, its presence; and no step sends a view or a dtype the profile's callers never
send (the steps once carried strided views and every batch field in its other dtype under every profile)."""

import pathlib
from dataclasses import replace

import pytest

from shardspec.conformance.cases.coverage import coverage
from shardspec.conformance.cases.multistep import multi_step_cases
from shardspec.fixtures.holding import allows
from shardspec.spec.case_edits import UPPER_BOUND_ABSENT
from shardspec.spec.guarantees import broken_guarantee
from shardspec.spec.profiles import PROFILES, load_profile_file, rules_of

ENGINE_PROFILE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "engine_profile" / "engine.yaml"


def _profiles() -> list[str]:
    return [*PROFILES, load_profile_file(ENGINE_PROFILE).name]


@pytest.mark.parametrize("profile", _profiles())
def test_every_step_holds_for_the_run_s_profile_and_changes_what_its_callers_change(profile):
    rules = rules_of(profile)
    tp = max(3, rules.min_tp)
    multi = multi_step_cases(tp, 2, 0, rules_of(profile))
    assert multi
    for case in multi:
        assert allows(rules, case), (profile, case.case_id)
        assert all(step.profile == profile for step in [case, *case.then])
    counts = coverage(multi, rules_of(profile)).counts
    changed = {v.field for v, n in counts.items() if n and v.axis == "step" and v.value == "changed"}
    assert ("batch.num_admitted_draft_tokens" in changed) == (rules.admits_drafts and rules.adaptive), profile
    assert ("batch.seq_lens_cpu_upper_bound" in changed) == rules.has_upper_bound, profile
    steps = [step for case in multi for step in [case, *case.then]]
    # the layouts and dtypes the profile's callers send (spec/guarantees.py; extension fields aside)
    kept = replace(rules, extension_fields="declared")
    assert [str(broken_guarantee(c, kept)) for c in multi if broken_guarantee(c, kept)] == [], profile
    absent = [UPPER_BOUND_ABSENT in step.edits for step in steps]
    optional = rules.has_upper_bound and not rules.upper_bound_required
    assert (any(absent) and not all(absent)) == optional, profile
