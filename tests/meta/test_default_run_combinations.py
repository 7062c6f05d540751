"""Variations of different fields that a defect needs together, drawn together by the default run: an
implementation wrong only where two of them meet must not pass `nox -s conformance`."""

import pytest

from shardspec.conformance import options
from shardspec.conformance.api import ImplChoice
from shardspec.conformance.replay import run_case_in_process
from shardspec.conformance.runner import cases_of_entry, collect_cases
from shardspec.spec.profiles import DEFAULT_PROFILE, rules_of

ROTATES_LARGE = "shardspec.conformance.broken.extensions:ExtensionEntriesRotatedInLargeBatches"


@pytest.fixture(scope="module")
def default_run():
    config = options.resolve_run({"impl": "reference"}, {}).config
    return config, collect_cases(config)


def _built(sizes: list[int]) -> list[int]:
    """The sizes the default profile builds a sharder for (vllm-0.34 none of one rank: PRE-TP-SIZE, whose
    refusal is all a tp 1 run of it judges)."""
    return [tp for tp in sizes if tp >= rules_of(DEFAULT_PROFILE).min_tp]


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
