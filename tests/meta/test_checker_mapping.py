"""Every invariant of spec/invariants.yaml has exactly one checker, and nothing else has one."""

import collections
import pathlib

import yaml

from shardspec.conformance.checks import GROUP_CHECKERS, RANK_CHECKERS

INVARIANTS = pathlib.Path(__file__).resolve().parents[2] / "spec" / "invariants.yaml"


def _yaml_ids() -> list[str]:
    entries = yaml.safe_load(INVARIANTS.read_text())["invariants"]
    return [entry["id"] for entry in entries if not entry.get("retired")]


def test_yaml_ids_are_unique():
    repeated = [i for i, n in collections.Counter(_yaml_ids()).items() if n > 1]
    assert not repeated, f"invariant IDs listed twice: {repeated}"


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
