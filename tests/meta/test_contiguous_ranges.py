"""The owner rule contiguous_ranges (CL-OWNER-CONTIGUOUS-RANGES) under the profile file that selects it
(examples/profiles/vllm-ascend-contiguous-ranges.yaml, not bundled): the reference, production and a mixed
group pass its targeted case and generated cases, and the broken entry with ceil-sized ranges fails
INV-OWNER."""

import pathlib

import pytest

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.broken import BY_NAME, cases
from shardspec.conformance.cases.strategies import generate_cases
from shardspec.conformance.replay import run_case_in_process
from shardspec.spec.case import case_owners
from shardspec.spec.profiles import load_profile_file, rules_of

PROFILE_FILE = pathlib.Path(__file__).parents[2] / "examples" / "profiles" / "vllm-ascend-contiguous-ranges.yaml"
PROFILE = load_profile_file(PROFILE_FILE).name
CHOICES = [ImplChoice("reference"), ImplChoice("production"), ImplChoice("reference", "production")]


def _violated(result) -> set[str]:
    return {v["invariant_id"] for v in result.violations}


def test_the_file_is_the_targeted_case_s_profile():
    assert PROFILE == cases.RANGES_PROFILE and rules_of(PROFILE).owner == "contiguous_ranges"
    assert cases.CONTIGUOUS_RANGES.rules == rules_of(PROFILE)
    assert case_owners(cases.CONTIGUOUS_RANGES) == [0, 0, 1, 2]


@pytest.mark.parametrize("choice", CHOICES, ids=lambda c: c.impl + (f"/{c.impl_odd}" if c.impl_odd else ""))
def test_the_bundled_implementations_pass(choice):
    generated = [c for tp in (2, 3) for c in generate_cases(tp, 6, 0, rules_of(PROFILE))]
    for case in [cases.CONTIGUOUS_RANGES, *generated]:
        result = run_case_in_process(case, choice)
        assert (result.errors, result.violations) == ([], []), case.case_id


def test_ranges_of_ceil_size_fail_inv_owner():
    entry = BY_NAME["ranges-of-ceil-size"]
    assert entry.profiles == ()  # no bundled profile has the rule: this test is where it runs
    result = run_case_in_process(cases.CONTIGUOUS_RANGES, ImplChoice(entry.target))
    assert not result.errors and entry.invariant_id == "INV-OWNER" and "INV-OWNER" in _violated(result)
