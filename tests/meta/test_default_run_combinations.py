"""Variations of different fields that a defect needs together, drawn together by the default run: an
implementation wrong only where two of them meet must not pass `nox -s conformance`."""

from dataclasses import replace

import pytest

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.cases.coverage import exercised
from shardspec.conformance.replay import run_case_in_process
from shardspec.conformance.run import resolve
from shardspec.conformance.run.collect import cases_of_entry, collect_cases
from shardspec.spec.case_edits import UPPER_BOUND_ABSENT
from shardspec.spec.guarantees import broken_guarantee
from shardspec.spec.profiles import DEFAULT_PROFILE, rules_of

ROTATES_LARGE = "shardspec.conformance.broken.extensions:ExtensionEntriesRotatedInLargeBatches"


@pytest.fixture(scope="module")
def default_run():
    # Under the profile of `nox -s conformance`'s main run (noxfile.py's MAIN_PROFILE): nothing outside the contract.
    config = resolve.resolve_run({"impl": "reference", "profile": "vllm-0.34-strict"}, {}).config
    return config, collect_cases(config)


def _built(sizes: list[int]) -> list[int]:
    """The sizes the default profile builds a sharder for (vllm-0.34 none of one rank: PRE-TP-SIZE, whose
    refusal is all a tp 1 run of it judges)."""
    return [tp for tp in sizes if tp >= rules_of(DEFAULT_PROFILE).min_tp]


def _sized(profiles: list[str], sizes: list[int]) -> list[tuple[str, int]]:
    """(profile, tp) for the sizes each profile builds a sharder for (vllm-0.33 and vllm-0.34 none of one rank)."""
    return [(profile, tp) for profile in profiles for tp in sizes if tp >= rules_of(profile).min_tp]


def _interleaved(case) -> bool:
    owners = [slot % case.tp_size for slot in case.slots]
    return any(a != b for a, b in zip(owners, owners[1:], strict=False))


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_extension_fields_meet_a_batch_of_many_requests_at_every_tp(default_run, tp):
    """Found by a hostile review: extension fields were drawn only with up to 6 requests, so gathering
    them in the wrong order above that passed the whole default run."""
    config, case_set = default_run
    cases = cases_of_entry(config, ImplChoice.parse("reference"), case_set, tp)
    many = [c for c in cases if c.extensions and len(c.slots) > 6 and _interleaved(c) and not c.expect_error]
    assert many, f"no valid case at tp {tp} has extension fields with more than 6 requests of interleaved owners"
    violated = [{v["invariant_id"] for v in run_case_in_process(c, ImplChoice(ROTATES_LARGE)).violations} for c in many]
    assert any("INV-GATHER-EXTENSIONS" in found for found in violated), violated


# State kept from one step to the next, keyed by the requests: passed every multi-step case while each
# later step drew fresh slots.
KEPT_BY_REQUESTS = {
    "shardspec.conformance.broken.state:StepCachedByRequests": "INV-LOCAL-SEQ-LENS",
    "shardspec.conformance.broken.state:DraftCountsCachedByRequestSet": "INV-LOCAL-DRAFTS",
}


@pytest.mark.parametrize("target", sorted(KEPT_BY_REQUESTS))
@pytest.mark.parametrize("tp", _built([1, 2, 8]))
def test_the_default_runs_decode_loop_catches_state_kept_by_requests(default_run, tp, target):
    config, case_set = default_run
    ran = {c.case_id for c in cases_of_entry(config, ImplChoice.parse("reference"), case_set, tp)}
    multi = {parent.case_id: parent for step_id, parent in case_set.parents.items() if step_id in ran}.values()
    assert multi, f"no multi-step case at tp {tp}"
    violated = set()
    for case in multi:
        violated |= {v["invariant_id"] for v in run_case_in_process(case, ImplChoice(target)).violations}
    assert KEPT_BY_REQUESTS[target] in violated, (target, sorted(violated))


CLAMPS_BF16_INFINITIES = "shardspec.conformance.broken.input_space:HalfInfinitiesClampedInBfloat16"


@pytest.mark.parametrize("tp", _built([1, 2, 4, 8]))
def test_bfloat16_logits_meet_infinities_at_every_tp(default_run, tp):
    """Drawn one field at a time, bfloat16 logits and infinite logits met only by chance."""
    config, case_set = default_run
    cases = cases_of_entry(config, ImplChoice.parse("reference"), case_set, tp)
    both = [c for c in cases if c.logits_dtype == "bfloat16" and "logits-limits" in c.edits and not c.expect_error]
    assert both, f"no case at tp {tp} has bfloat16 logits at their limits"
    violated = set().union(
        *(
            {v["invariant_id"] for v in run_case_in_process(c, ImplChoice(CLAMPS_BF16_INFINITIES)).violations}
            for c in both
        )
    )
    assert "INV-A2A-SPLITS" in violated, sorted(violated)


# Kept from the sharder's first step where a later step's profile inputs differ: passed every multi-step case
# while the steps were built from the seed profile's inputs (no admitted counts, no batch dtypes on any step).
KEPT_ACROSS_PROFILE_INPUTS = {
    "shardspec.conformance.broken.state:LocalDraftsCachedByScheduledDrafts": (
        "INV-LOCAL-DRAFTS",
        ["vllm-0.33", "vllm-0.34"],
    ),
    # idx_mapping in int32: sent where the callers send every accepted dtype
    "shardspec.conformance.broken.state:LocalIdxMappingInFirstStepsDtype": (
        "INV-LOCAL-IDX-MAPPING",
        ["vllm-0.34-strict"],
    ),
}


@pytest.fixture(scope="module")
def run_under():
    """The default run's cases under a profile named explicitly (built once per profile)."""
    made = {}

    def run(profile: str):
        if profile not in made:
            config = resolve.resolve_run({"impl": "reference", "profile": profile}, {}).config
            made[profile] = config, collect_cases(config)
        return made[profile]

    return run


def _multi_step_cases(config, case_set, tp: int) -> list:
    ran = {c.case_id for c in cases_of_entry(config, ImplChoice.parse("reference"), case_set, tp)}
    return list({parent.case_id: parent for step_id, parent in case_set.parents.items() if step_id in ran}.values())


# Profiles whose callers send the batch's fields in the engine's dtypes only, and in every accepted one (dtypes:
# engine, accepted; spec/guarantees.py): the other dtypes are drawn under the second only.
EVERY_DTYPE = "vllm-0.34-strict"


@pytest.mark.parametrize(("profile", "tp"), _sized(["vllm-0.33", "vllm-0.34", EVERY_DTYPE], [1, 2, 8]))
def test_every_step_of_a_multi_step_case_draws_the_profiles_inputs(run_under, profile, tp):
    config, case_set = run_under(profile)
    multi = _multi_step_cases(config, case_set, tp)
    later = [step for case in multi for step in case.then]
    assert any(step.admitted_drafts is not None for step in later), f"no later step has admitted counts at tp {tp}"
    rules = rules_of(profile)
    if not rules.engine_dtypes_only:
        assert any(step.batch_dtypes for step in later), f"no later step has batch dtypes at tp {tp}"
    # the layouts and dtypes its callers send (extension fields aside: the steps still declare some)
    kept = replace(rules, extension_fields="declared")
    assert [str(broken_guarantee(c, kept)) for c in multi if broken_guarantee(c, kept)] == []
    for case in multi:  # the sharder's construction argument is the same on every step
        assert {step.adaptive_verification for step in [case, *case.then]} == {case.adaptive_verification}
    assert any(case.adaptive_verification for case in multi)


@pytest.mark.parametrize(
    ("target", "profile", "tp"),
    [
        (t, p, tp)
        for t, (_, profiles) in sorted(KEPT_ACROSS_PROFILE_INPUTS.items())
        for p, tp in _sized(profiles, [1, 2, 8])
    ],
)
def test_the_default_runs_steps_catch_state_kept_across_profile_inputs(run_under, profile, tp, target):
    config, case_set = run_under(profile)
    multi = _multi_step_cases(config, case_set, tp)
    assert multi, f"no multi-step case at tp {tp}"
    violated = set()
    for case in multi:
        violated |= {v["invariant_id"] for v in run_case_in_process(case, ImplChoice(target)).violations}
    assert KEPT_ACROSS_PROFILE_INPUTS[target][0] in violated, (target, sorted(violated))


# The ends of sizes no case drew before the size axis (conformance/cases/sizes.py).
AT_A_SIZES_END = {
    "shardspec.conformance.broken.sizes:GrammarListingNothingHandedOn": "INV-LOCAL-GRAMMAR",
    "shardspec.conformance.broken.sizes:LogprobColumnsStagedInFixedBuffer": "INV-LOGPROBS-SHAPES",
}


@pytest.mark.parametrize("target", sorted(AT_A_SIZES_END))
@pytest.mark.parametrize("tp", _built([1, 2, 3, 4, 8]))
def test_the_default_run_catches_defects_at_a_sizes_end(default_run, tp, target):
    config, case_set = default_run
    cases = cases_of_entry(config, ImplChoice.parse("reference"), case_set, tp)
    ends = {"G:size=empty", "k:size=largest"}
    drawing = [c for c in cases if not c.expect_error and ends & {v.key for v in exercised(c)}]
    violated = set().union(
        *({v["invariant_id"] for v in run_case_in_process(c, ImplChoice(target)).violations} for c in drawing)
    )
    assert AT_A_SIZES_END[target] in violated, sorted(violated)


GRAMMAR_DROPPED_WITHOUT_BOUND = "shardspec.conformance.broken.pairs:GrammarDroppedWithoutUpperBound"


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8])
def test_a_profile_field_meets_each_optional_output_at_every_tp(default_run, tp):
    """The bound left out and a grammar output met only by chance, never at tp 1, 2 and 3 (seed 0). Where the
    default profile's engine always passes the bound, no valid case leaves it out (it is PRE-SEQ-LENS-UPPER-BOUND
    there); tests/meta/test_input_space.py runs the defect under a profile where it is optional."""
    config, case_set = default_run
    cases = cases_of_entry(config, ImplChoice.parse("reference"), case_set, tp)
    if rules_of(config.profile).upper_bound_required:
        assert cases and not [c.case_id for c in cases if not c.expect_error and UPPER_BOUND_ABSENT in c.edits]
        return
    key = "batch.seq_lens_cpu_upper_bound+grammar:pair=presence=absent,presence=present"
    both = [c for c in cases if not c.expect_error and key in {v.key for v in exercised(c)}]
    assert both, f"no case at tp {tp} leaves the bound out with a grammar output"
    violated = set().union(
        *(
            {v["invariant_id"] for v in run_case_in_process(c, ImplChoice(GRAMMAR_DROPPED_WITHOUT_BOUND)).violations}
            for c in both
        )
    )
    assert "INV-LOCAL-GRAMMAR" in violated, sorted(violated)
