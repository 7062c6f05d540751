"""The checkers catch every defect of the broken corpus, and pass the reference.

Each corpus entry runs on its targeted cases in one process; the invariant its
docstring names must be among the violations of every one of them. The
reference and the controls (variants within the spec's freedom) must pass.
"""

import pytest

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.broken import CORPUS, cases
from shardspec.conformance.broken.profiles import BUNDLED_RULES
from shardspec.conformance.harness.group import Job
from shardspec.conformance.harness.multiprocess import LaunchOptions, run_jobs_multiprocess
from shardspec.conformance.replay import run_case_in_process, suite_judge
from shardspec.fixtures.catalogue import case_rules, with_profile
from shardspec.reference import ReferenceSharder
from shardspec.spec.loader import load_spec
from shardspec.spec.profiles import DEFAULT_PROFILE, PROFILES

YAML_IDS = {invariant.id for invariant in load_spec().invariants}
CONTROLS = [
    "reference",
    "shardspec.conformance.broken.conforming:GarbageWirePadding",
    "shardspec.conformance.broken.conforming:RankDependentRowsPastTheAdmitted",
]

# Each entry in every in-process group it can run in (those calling torch.distributed need a group that has one);
# an entry whose defect shows only in a world of several TP groups runs in rank processes (WORLD_ENTRIES).
RUNS = [
    pytest.param(entry, case_id, group, profile, id=f"{entry.name}/{case_id}-{group}-{profile}")
    for entry in CORPUS
    if entry.tp_groups == 1
    for case_id in entry.cases
    for group in entry.groups
    for profile in entry.profiles
]
# Every entry on every targeted case of its profiles: whatever a defect does, no checker crashes.


# How many of the corpus's other cases each entry meets beyond its own targeted ones. The cases are dealt out
# in turn (entry i meets the next OTHER_CASES after entry i-1's), so every case meets about
# len(CORPUS) * OTHER_CASES / len(cases.ALL) entries (13 today) and every entry about 5 cases: every kind of
# broken output still reaches every checker, at a sixth of the cost of every entry on every case (4,064 runs,
# the largest part of the tests' CI budget).
OTHER_CASES = 4


def _cases_met(number, entry):
    """The entry's targeted cases, then OTHER_CASES more of the corpus, dealt out in turn across the entries."""
    dealt = [cases.ALL[(number * OTHER_CASES + k) % len(cases.ALL)] for k in range(OTHER_CASES)]
    return list({case.case_id: case for case in [*(cases.BY_ID[i] for i in entry.cases), *dealt]}.values())


def _one_profile_each(number, entry):
    """Each case the entry meets under one of the entry's profiles that it holds for, the profiles taken in
    turn: every profile's checkers meet broken outputs of every kind across the corpus."""
    for turn, case in enumerate(_cases_met(number, entry)):
        held = [profile for profile in entry.profiles if profile in {rules.profile for rules in case_rules(case)}]
        if held:
            yield case, held[(number + turn) % len(held)]


ALL_RUNS = [
    pytest.param(entry, with_profile(case, BUNDLED_RULES[profile]), id=f"{entry.name}/{case.case_id}-{profile}")
    for number, entry in enumerate(CORPUS)
    for case, profile in _one_profile_each(number, entry)
]


def _violated(result) -> set[str]:
    return {v["invariant_id"] for v in result.violations}


@pytest.mark.parametrize("entry, case_id, group, profile", RUNS)
def test_checkers_catch_the_defect(entry, case_id, group, profile):
    """In both in-process groups: a defect in the wire sequence must be reported, not hang the run."""
    result = run_case_in_process(
        with_profile(cases.BY_ID[case_id], BUNDLED_RULES[profile]), ImplChoice(entry.target), group=group
    )
    assert not result.errors, f"{entry.name} should fail checks, not crash: {result.errors}"
    found = _violated(result)
    assert entry.invariant_id in found, (
        f"{entry.name} ({entry.description}) on {case_id}: expected {entry.invariant_id}, got {sorted(found)}"
    )


WORLD_ENTRIES = [entry for entry in CORPUS if entry.tp_groups > 1]


@pytest.mark.parametrize("entry", WORLD_ENTRIES, ids=[e.name for e in WORLD_ENTRIES])
def test_checkers_catch_the_defect_in_a_world_of_several_tp_groups(entry, tmp_path):
    """Rank processes (fork) as entry.tp_groups TP groups of one world: every targeted case fails by the entry's
    invariant. In-process, where the world is the one TP group, the same cases pass: only such a world tells."""
    targeted = [
        with_profile(cases.BY_ID[case_id], BUNDLED_RULES[profile])
        for case_id in entry.cases
        for profile in entry.profiles
    ]
    for case in targeted:
        alone = run_case_in_process(case, ImplChoice(entry.target), group=entry.groups[0])
        assert (alone.status, alone.errors) == ("pass", []), (case.case_id, alone.errors, alone.violations)
    [tp] = {case.tp_size for case in targeted}
    options = LaunchOptions(tmp_path / "run", 60, 60, launcher="fork", tp_groups=entry.tp_groups)
    servers: dict = {}
    jobs = [Job(ImplChoice(entry.target), case) for case in targeted]
    try:
        results = run_jobs_multiprocess(jobs, tp, options, suite_judge(), log=lambda line: None, servers=servers)
    finally:
        for server in servers.values():
            server.close()
    for case, result in zip(targeted, results, strict=True):
        assert not result.errors, f"{entry.name} should fail checks, not crash: {result.errors}"
        assert entry.invariant_id in _violated(result), (case.case_id, result.violations)


@pytest.mark.parametrize("entry, case", ALL_RUNS)
def test_checkers_never_crash_on_broken_outputs(entry, case):
    result = run_case_in_process(case, ImplChoice(entry.target), group=entry.groups[0])
    crashed = [v["message"] for v in result.violations if v["message"].startswith("checker raised")]
    assert not crashed, f"checkers must judge broken outputs, not crash on them: {crashed}"


@pytest.mark.parametrize("entry", CORPUS, ids=[e.name for e in CORPUS])
def test_entry_is_documented_reference_subclass(entry):
    assert issubclass(entry.factory, ReferenceSharder)
    assert entry.invariant_id in YAML_IDS, f"{entry.target}: docstring must start with an invariant ID"
    assert entry.description, f"{entry.target}: docstring must describe the defect"
    assert entry.cases and all(case_id in cases.BY_ID for case_id in entry.cases)


def test_corpus_names_are_unique_and_every_invariant_has_an_entry():
    names = [entry.name for entry in CORPUS]
    assert len(names) == len(set(names))
    uncovered = YAML_IDS - {entry.invariant_id for entry in CORPUS}
    assert not uncovered, f"invariants no corpus entry proves: {sorted(uncovered)}"
    for profile in PROFILES:
        proven = {entry.invariant_id for entry in CORPUS if profile in entry.profiles}
        # An invariant whose text differs by profile is proven in each profile it has a version for.
        own = {inv.id for inv in load_spec(profile=profile).invariants if inv.profiles}
        assert own <= proven, (
            f"{profile}: profile-specific invariants no entry of that profile proves: {sorted(own - proven)}"
        )


@pytest.mark.parametrize("group", ["lockstep", "torch-threads"])
@pytest.mark.parametrize("impl", CONTROLS)
@pytest.mark.parametrize("case", cases.ALL, ids=[c.case_id for c in cases.ALL])
def test_controls_pass_targeted_cases(case, impl, group):
    # Under the default profile where the case holds for it, else under the first profile it holds for.
    held = case_rules(case)
    rules = next((rules for rules in held if rules.profile == DEFAULT_PROFILE), held[0])
    result = run_case_in_process(with_profile(case, rules), ImplChoice(impl), group=group)
    assert (result.errors, result.violations) == ([], [])


def _fixture_cases():
    try:
        from shardspec.fixtures import load_cases
    except ImportError:
        return []
    return load_cases()


FIXTURES = _fixture_cases()


@pytest.mark.skipif(not FIXTURES, reason="no fixture catalogue (shardspec.fixtures.load_cases)")
@pytest.mark.parametrize("impl", CONTROLS)
@pytest.mark.parametrize("case", FIXTURES, ids=[c.case_id for c in FIXTURES])
def test_controls_pass_fixture_cases(case, impl):
    result = run_case_in_process(case, ImplChoice(impl))
    assert (result.errors, result.violations) == ([], [])
