"""Every printed reproduce command judges its case as the run did: the profile (a profile file by its path,
with its content's hash), the TP groups and the kind of group are in it. Before, the commands dropped
--profile, --profile-file and --tp-groups: they passed where the run failed, or could not load."""

import hashlib
import json
import pathlib
import shlex
import shutil

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.cli import build_parser, main
from shardspec.conformance.run.config import RunConfig
from shardspec.conformance.run.reproduce import mode_args, reproduce_command
from shardspec.conformance.run.resolve import resolve
from shardspec.conformance.usage import DEPLOY_TIER
from shardspec.fixtures import load_case
from shardspec.spec.profiles import rules_of

PROFILE_FILE = pathlib.Path(__file__).parent / "data" / "profiles" / "position-owner-any-dtype.yaml"
ENTRY = "default_profile_sharder:make"
FIXTURES = pathlib.Path(__file__).parents[2] / "fixtures" / "cases"


def _cases(report: pathlib.Path) -> dict:
    return {c["case_id"]: c for c in json.loads(report.read_text())["sections"][0]["cases"]}


def _verdict(case: dict) -> tuple:
    return case["status"], sorted({v["invariant_id"] for v in case["violations"]})


def test_each_kind_of_printed_command_under_a_profile_file_gets_the_runs_verdict(tmp_path, plugins_on_path):
    report = tmp_path / "r.json"
    # A fixture (named by its id) and a case file (named by its path, as a case the run made is).
    case_file = tmp_path / "tp2-local-dtypes-follow-input.yaml"
    shutil.copy(FIXTURES / "tp2-local-dtypes-follow-input.yaml", case_file)
    args = ["--in-process", "--impl", ENTRY, "--profile-file", str(PROFILE_FILE), "--case", "tp2-admitted-drafts"]
    args += ["--case-file", str(case_file), "--json", str(report)]
    assert main([*args, "--run-dir", str(tmp_path / "run")]) == 1
    failing = [c for c in _cases(report).values() if c["status"] == "fail"]
    kinds = {kind: next(c for c in failing if f" {kind} " in c["reproduce"]) for kind in ("--case", "--case-file")}
    digest = hashlib.sha256(PROFILE_FILE.read_bytes()).hexdigest()
    for n, case in enumerate(kinds.values()):
        command = case["reproduce"]
        assert command.endswith(f"# profile file sha256 {digest}"), command
        argv = shlex.split(command, comments=True)
        assert argv[:3] == ["python", "-m", "shardspec.conformance"]
        assert argv[argv.index("--profile-file") + 1] == str(PROFILE_FILE), command
        again = tmp_path / f"again-{n}.json"
        assert main([*argv[3:], "--json", str(again), "--run-dir", str(tmp_path / f"again-{n}")]) == 1, command
        assert _verdict(_cases(again)[case["case_id"]]) == _verdict(case), command


def test_a_printed_command_resolves_to_the_runs_profile_tp_groups_and_group(tmp_path):
    """Profile, TP groups and the kind of group, whatever $SHARDSPEC_PROFILE says where it is run."""
    case = load_case("tp2-decode", "vllm-seed")
    for config in (
        RunConfig(rules=rules_of("vllm-seed"), tp_groups=2, share_gpus=False, size_tier=DEPLOY_TIER),
        RunConfig(
            rules=rules_of("vllm-seed"), in_process=True, in_process_group="torch-threads", in_process_device="cpu"
        ),
    ):
        command = reproduce_command(ImplChoice("reference"), case, False, tmp_path, mode_args(config))
        argv = shlex.split(command, comments=True)[3:]
        values = resolve(vars(build_parser().parse_args(argv)), {"SHARDSPEC_PROFILE": "vllm-0.33"})
        assert values["profile"] == config.profile and values["tp_groups"] == config.tp_groups, command
        assert values["in_process"] == config.in_process and values["in_process_group"] == config.in_process_group
        assert values["case"] == ["tp2-decode"] and values["in_process_device"] == config.in_process_device
        assert values["size_tier"] == config.size_tier, command


def test_a_case_on_the_initial_owner_table_is_written_so_that_its_command_loads_it(tmp_path):
    """A case of the run on the initial owner table (no entries, as generated and deployed cases may be)
    holds under an owner-table profile only where its file writes the table out; before, the printed command
    was refused ("the case holds for profile(s) ..., not vllm-0.34-sharded-draft-cache")."""
    from dataclasses import replace

    from shardspec.conformance.run.reproduce import write_case_file
    from shardspec.fixtures.catalogue import load_case_file
    from shardspec.fixtures.holding import holds_under

    profile = "vllm-0.34-sharded-draft-cache"
    case = replace(load_case("tp2-owner-table-initial", profile), case_id="gen-tp2-s0-000", owner_table=None)
    case = replace(case, requires=(), then=[replace(case, owner_table=None)])
    written = load_case_file(write_case_file(case, tmp_path))
    assert written.owner_table == {} and written.then[0].owner_table == {}
    assert holds_under(rules_of(profile), written)
