"""The sizes engines deploy are in `nox -s conformance`: a batch of 1024 requests and a vocabulary of 151936
columns split over the group (conformance/cases/deployment.py), and a world of two TP groups (noxfile.py's
DP_WORLD_OPTIONS and DP_WORLD_CASES). Each rejects the broken entry whose defect shows only there, and no other
case of the default run reaches past that entry's threshold: before these draws, the entries passed it. The
deploy tier (--size-tier deploy) runs every deployed size at every group size, and larger ones; CI runs it."""

import ast
import pathlib

import pytest

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.broken import BY_NAME
from shardspec.conformance.broken.scale import EXCHANGE_CHUNK_COLUMNS, GATHER_STAGE_ROWS
from shardspec.conformance.cases.deployment import deploy_tier_cases
from shardspec.conformance.harness.group import Job
from shardspec.conformance.harness.multiprocess import LaunchOptions, run_jobs_multiprocess
from shardspec.conformance.replay import run_case_in_process, suite_judge
from shardspec.conformance.run import options, resolve
from shardspec.conformance.run.collect import collect_cases
from shardspec.conformance.run.reproduce import mode_args
from shardspec.spec.profiles import rules_of

NOXFILE = pathlib.Path(__file__).resolve().parents[2] / "noxfile.py"
CI = NOXFILE.with_name(".ci") / "run"
# Each entry, and what puts a case past its threshold.
PAST_THRESHOLD = {
    "rows-shifted-past-512-requests": lambda case: len(case.slots) > GATHER_STAGE_ROWS,
    "columns-shifted-past-4096": lambda case: case.padded_vocab_size > EXCHANGE_CHUNK_COLUMNS,
}


@pytest.fixture(scope="module")
def default_run():
    config = resolve.resolve_run({"impl": "reference"}, {}).config
    return config, collect_cases(config)


def test_the_default_run_has_a_batch_and_a_vocabulary_of_deployed_sizes(default_run):
    _, case_set = default_run
    deployed = [c for c in case_set.cases if c.case_id in case_set.deployed and c.expect_error is None]
    assert any(len(c.slots) >= 1024 and c.max_num_reqs >= 1024 for c in deployed), sorted(case_set.deployed)
    assert any(c.vocab_size >= 128 * 1024 and c.tp_size > 1 for c in deployed), sorted(case_set.deployed)


@pytest.mark.parametrize("name", sorted(PAST_THRESHOLD))
def test_only_the_deployed_sizes_reject_each_entry(default_run, name):
    """The deployed cases past the entry's threshold fail it by its invariant; every other case of the run (the
    fixtures, generated, multi-step and boundary cases) stays below the threshold, where the entry is the
    reference."""
    _, case_set = default_run
    entry, past = BY_NAME[name], PAST_THRESHOLD[name]
    beyond = [c for c in case_set.cases if past(c)]
    assert beyond and {c.case_id for c in beyond} <= case_set.deployed, [c.case_id for c in beyond]
    for case in beyond:
        found = {v["invariant_id"] for v in run_case_in_process(case, ImplChoice(entry.target)).violations}
        assert entry.invariant_id in found, (case.case_id, found)


def _nox_constant(name: str):
    """A literal constant of noxfile.py (it is read, not imported: nox is no test dependency)."""
    for node in ast.parse(NOXFILE.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"noxfile.py no longer has {name}, where this test reads the world of several TP groups")


def test_the_default_run_s_world_of_two_tp_groups_rejects_the_default_group_entry(tmp_path):
    """`nox -s conformance`'s run of two TP groups, as its options give it, fails an exchange on the default
    group by INV-WIRE-SEQUENCE in every valid case it runs (a rejection comes before any exchange)."""
    by_flag = {option.plugin_flag: option for option in options.OPTIONS}
    flags = _nox_constant("DP_WORLD_OPTIONS")
    given = {by_flag[flag].name: value for flag, value in zip(flags[::2], flags[1::2], strict=True)}
    entry = BY_NAME["all-to-all-on-the-default-group"]
    given.update(impl=entry.target, case=list(_nox_constant("DP_WORLD_CASES")))
    resolved = resolve.resolve_run(given, {})
    assert resolved.config.tp_groups > 1 and resolved.cases is not None
    [tp] = resolved.config.tp_sizes
    valid = [case for case in resolved.cases.cases if case.expect_error is None]
    assert valid
    launch = LaunchOptions(tmp_path / "run", 60, 60, launcher="fork", tp_groups=resolved.config.tp_groups)
    servers: dict = {}
    try:
        jobs = [Job(ImplChoice(entry.target), case) for case in valid]
        results = run_jobs_multiprocess(jobs, tp, launch, suite_judge(), log=lambda line: None, servers=servers)
    finally:
        for server in servers.values():
            server.close()
    for case, result in zip(valid, results, strict=True):
        assert entry.invariant_id in {v["invariant_id"] for v in result.violations}, (case.case_id, result.errors)


def test_the_deploy_tier_runs_every_deployed_size_at_every_group_size_and_nothing_else():
    config = resolve.resolve_run({"impl": "reference", "size_tier": "deploy"}, {}).config
    case_set = collect_cases(config)
    built = [tp for tp in config.tp_sizes if tp >= rules_of(config.profile).min_tp]
    assert [c.case_id for c in case_set.cases] == [
        c.case_id for tp in built for c in deploy_tier_cases(tp, rules_of(config.profile), config.seed)
    ]
    assert case_set.deployed == {c.case_id for c in case_set.cases} and not case_set.generated | case_set.boundary
    for tp in built:
        at_tp = [c for c in case_set.cases if c.tp_size == tp]
        assert max(len(c.slots) for c in at_tp) >= 4096 and max(c.vocab_size for c in at_tp) >= 262144


def test_reproduce_commands_name_the_size_tier():
    """Only a run of the deploy tier names it (a case it made is named by its file too)."""
    deploy = mode_args(resolve.resolve_run({"impl": "reference", "size_tier": "deploy"}, {}).config)
    assert deploy[deploy.index("--size-tier") + 1] == "deploy", deploy
    assert "--size-tier" not in mode_args(resolve.resolve_run({"impl": "reference"}, {}).config)


def test_ci_runs_the_deploy_tier():
    lines = [line.removeprefix("step ") for line in CI.read_text().replace("\\\n", " ").splitlines()]
    assert any(line.startswith("nox -s conformance -- ") and "--shardspec-size-tier deploy" in line for line in lines)
