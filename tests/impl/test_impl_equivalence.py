"""The production sharder equals the reference: every output, dtype, host copy and wire payload.

Every catalogue case under each distinct expectation it has (one profile per stored golden: a profile
whose golden of a case is its parent's adds nothing to compare here, and nox -s conformance runs every
bundled profile); the random cases under every profile. Runs the Triton kernels in the interpreter on CPU
tensors where no GPU is present (tests/conftest.py sets TRITON_INTERPRET=1), and compiled on a GPU.
"""

import pytest
from impl_steps import all_ranks, assert_traces_equal, mixed, random_case, run_case

from shardspec.fixtures.catalogue import load_cases
from shardspec.fixtures.golden_files import golden_path
from shardspec.spec.model import PROFILES
from shardspec.spec.profiles import rules_of


def _one_per_golden(cases):
    """The first case of each stored golden file (cases under profiles whose expectation is the same share one)."""
    first = {}
    for case in cases:
        first.setdefault(golden_path(case.case_id, case.profile), case)
    return list(first.values())


CATALOGUE = _one_per_golden(case for case in load_cases(None) if case.expect_error is None)


def _case_id(case) -> str:
    return f"{case.profile}:{case.case_id}"


@pytest.mark.parametrize("case", CATALOGUE, ids=_case_id)
def test_catalogue_case_matches_reference(case):
    expected = run_case(case, all_ranks("reference"))
    assert_traces_equal(case, expected, run_case(case, all_ranks("production")))


# Every other multi-rank case keeps the suite fast; the random cases add more mixed groups.
MIXED = [case for case in CATALOGUE if case.tp_size > 1][::2]


@pytest.mark.parametrize("case", MIXED, ids=_case_id)
def test_mixed_group_matches_reference(case):
    """Reference on even ranks, production on odd ranks: same results, same wire payloads."""
    expected = run_case(case, all_ranks("reference"))
    assert_traces_equal(case, expected, run_case(case, mixed))


# Each profile at every group size it builds a sharder for (vllm-0.33, vllm-0.34: none of one rank, PRE-TP-SIZE).
SIZED = [(tp, profile) for profile in PROFILES for tp in (1, 2, 3, 4, 8) if tp >= rules_of(profile).min_tp]


@pytest.mark.parametrize(("tp", "profile"), SIZED)
@pytest.mark.parametrize("seed", range(3))
def test_random_case_matches_reference(tp, seed, profile):
    case = random_case(seed * 31 + tp, tp, profile=profile)
    expected = run_case(case, all_ranks("reference"))
    assert_traces_equal(case, expected, run_case(case, all_ranks("production")))


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("tp", [2, 3, 8])
def test_random_mixed_group_matches_reference(tp, profile):
    case = random_case(1000 + tp, tp, profile=profile)
    assert_traces_equal(case, run_case(case, all_ranks("reference")), run_case(case, mixed))
