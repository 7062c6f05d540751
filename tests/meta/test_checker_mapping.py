"""Every invariant of the spec has exactly one checker, and nothing else has one.

The spec is read through its loader, which also refuses an ID listed twice.
"""

from shardspec.conformance.judge.checks import GROUP_CHECKERS, RANK_CHECKERS
from shardspec.spec.loader import load_spec


def _yaml_ids() -> list[str]:
    """Each ID once: an ID with one entry per profile has one checker, which reads the case's profile."""
    return sorted({invariant.id for invariant in load_spec().invariants if not invariant.retired})


def test_no_invariant_has_both_a_rank_and_a_group_checker():
    assert not set(RANK_CHECKERS) & set(GROUP_CHECKERS)


def test_every_invariant_has_a_checker():
    missing = set(_yaml_ids()) - set(RANK_CHECKERS) - set(GROUP_CHECKERS)
    assert not missing, f"invariants without a checker: {sorted(missing)}"


def test_every_checker_belongs_to_an_invariant():
    extra = (set(RANK_CHECKERS) | set(GROUP_CHECKERS)) - set(_yaml_ids())
    assert not extra, f"checkers of unknown invariant IDs: {sorted(extra)}"


def test_one_to_one():
    registered = sorted([*RANK_CHECKERS, *GROUP_CHECKERS])
    assert registered == sorted(_yaml_ids())


def test_group_checkers_are_the_cross_rank_invariants():
    assert set(GROUP_CHECKERS) == {"INV-RANK-AGREEMENT", "INV-WIRE-SEQUENCE"}
