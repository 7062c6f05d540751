"""What `nox -s conformance` (its entries, the options' defaults) draws of the input space, per entry and tp:
every variation but those listed here, each with why it is not drawn yet. A variation newly drawn, or
newly lost, fails the test until the list says so (the coverage report prints the same per run)."""

import pathlib
import re

import pytest

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.cases.coverage import coverage
from shardspec.conformance.run import resolve
from shardspec.conformance.run.collect import cases_of_entry, collect_cases
from shardspec.spec.profiles import rules_of

NOXFILE = pathlib.Path(__file__).resolve().parents[2] / "noxfile.py"

# Not drawn at any size, and why (none now: a variation the default run cannot draw is listed here with
# the reason, until a realizer draws it).
NEVER: set[str] = set()
# Not drawn at one size only: {tp: variations}.
AT_SIZE: dict[int, set[str]] = {}


def _nox_entries() -> str:
    found = re.search(r'os\.environ\.get\("SHARDSPEC_IMPL", "([^"]+)"\)', NOXFILE.read_text())
    assert found, "noxfile.py no longer names the conformance session's entries where this test reads them"
    return found.group(1)


def _nox_profile() -> str:
    found = re.search(r'MAIN_PROFILE = \("--shardspec-profile", "([^"]+)"\)', NOXFILE.read_text())
    assert found, "noxfile.py no longer names the conformance session's main profile where this test reads it"
    return found.group(1)


@pytest.fixture(scope="module")
def default_run():
    config = resolve.resolve_run({"impl": _nox_entries(), "profile": _nox_profile()}, {}).config
    return config, collect_cases(config)


def test_the_default_run_draws_every_variation_but_the_listed_ones(default_run):
    config, case_set = default_run
    assert config.impls == ["reference", "production", "reference/production"]
    checked = 0
    for impl in config.impls:
        choice = ImplChoice.parse(impl)
        for tp in (tp for tp in config.tp_sizes if choice.applies_to(tp)):
            run = cases_of_entry(config, choice, case_set, tp)
            if tp < rules_of(config.profile).min_tp:  # no sharder of tp ranks: its refusal is all there is
                assert run and {c.expect_error for c in run} == {"PRE-TP-SIZE"}, (impl, tp, [c.case_id for c in run])
                checked += 1
                continue
            missing = {v.key for v in coverage(run, rules_of(config.profile)).not_covered}
            differs = sorted(missing ^ (NEVER | AT_SIZE.get(tp, set())))
            assert not differs, (impl, tp, differs, _drawing(case_set, tp, differs), [c.case_id for c in run])
            checked += 1
    assert checked == 2 * len(config.tp_sizes) + len(config.tp_sizes) - 1


def _drawing(case_set, tp: int, keys: list[str]) -> dict[str, list[str]]:
    """Which cases of the run at ``tp`` draw each of ``keys`` (what a failure needs to be read)."""
    from shardspec.conformance.cases.coverage import exercised

    at_tp = [c for c in case_set.cases if c.tp_size == tp]
    return {key: [c.case_id for c in at_tp if key in {v.key for v in exercised(c)}] for key in keys}


def test_every_listed_variation_is_in_the_space(default_run):
    config, case_set = default_run
    space = {v.key for v in coverage([], rules_of(config.profile)).space}
    assert NEVER | set().union(*AT_SIZE.values()) <= space
