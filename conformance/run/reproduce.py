"""How to reproduce each result: one command per case and entry, made before any case runs.

A fixture is named by its id (``--case ID``), a case file by its path, a case the run made (generated, at
a precondition's boundary, at a deployed size) by the file written for it in the run directory, and a step
of a multi-step case by its whole case's file. They are made when the run starts (:func:`prepare_reproduction`), so an
interruption (SIGINT, SIGTERM) cannot leave a failure without its command.

Each command carries every option that changes a verdict (:func:`mode_args`): the profile (a profile file by
its path, with the sha256 of its content in a trailing comment, so a file edited since is noticed), the TP
groups of a world, and the kind of group. The seed and the sizes drawn are not options of it: a case made by
the run is named by its written file, which holds what was drawn.
"""

from __future__ import annotations

import pathlib
from dataclasses import replace

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.record import CaseResult
from shardspec.conformance.run.config import CaseSet, RunConfig
from shardspec.conformance.usage import DEFAULT_TIER
from shardspec.fixtures import case_to_yaml
from shardspec.spec.case import Case
from shardspec.spec.profiles import is_profile, profile_source


def prepare_reproduction(case_set: CaseSet, run_dir: pathlib.Path) -> None:
    """What selects each case in a reproduce command, made before any case runs (an interruption cannot
    lose it): a fixture by its id, a case file by its path, a case made by this run (generated, at a
    boundary) by the file written for it here, and a step of a multi-step case by its whole case's file (a
    later step needs the ones before). Cases already prepared are kept."""
    for case in case_set.cases:
        if case.case_id in case_set.selections:
            continue
        parent = case_set.parents.get(case.case_id)
        if case.case_id in case_set.files:
            selection = f"--case-file {case_set.files[case.case_id]}"
        elif parent is not None:
            path = run_dir / "failing" / f"{parent.case_id}.yaml"
            if not path.exists():
                write_case_file(parent, run_dir)
            selection = f"--case-file {path} --tp {parent.tp_size}"
        elif case.case_id in case_set.generated | case_set.boundary | case_set.deployed:
            selection = f"--case-file {write_case_file(case, run_dir)} --tp {case.tp_size}"
        else:
            selection = f"--case {case.case_id}"
        case_set.selections[case.case_id] = selection


def annotate(
    config: RunConfig, choice: ImplChoice, result: CaseResult, case_set: CaseSet, run_dir: pathlib.Path
) -> CaseResult:
    """``result`` with whether its case was generated, the guarantee it breaks (a robustness run's) and, unless
    it has one, its reproduce command."""
    result.generated = result.case_id in case_set.generated
    result.outside = str(case_set.outside.get(result.case_id, ""))
    if not result.reproduce:
        if result.case_id not in case_set.selections:
            prepare_reproduction(case_set, run_dir)
        selection = case_set.selections.get(result.case_id, f"--case {result.case_id}")
        sent = ("--robustness",) if result.outside else ()  # only a robustness run sends it
        result.reproduce = _command(choice, selection, (*mode_args(config), *sent))
    return result


def write_case_file(case: Case, run_dir: pathlib.Path) -> pathlib.Path:
    folder = run_dir / "failing"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{case.case_id}.yaml"
    path.write_text(case_to_yaml(_table_written_out(case)))
    return path


def _table_written_out(case: Case) -> Case:
    """Under owner rule owner_table a case file holds only where it writes its table out (CL-OWNER-TABLE): a
    case of this run on the initial table (no entries) gets that table written as no entries, else its
    printed command could not load it under the run's profile."""
    if not case.rules.owner_by_table:
        return case
    steps = [replace(step, owner_table={}) if step.owner_table is None else step for step in case.then]
    return replace(case, owner_table={} if case.owner_table is None else case.owner_table, then=steps)


def reproduce_command(choice: ImplChoice, case: Case, made_here: bool, run_dir: pathlib.Path, mode: tuple = ()) -> str:
    """A fixture is named by its id; a case made by this run (generated, or at a boundary) by its written file."""
    if not made_here:
        return _command(choice, f"--case {case.case_id}", mode)
    path = run_dir / "failing" / f"{case.case_id}.yaml"
    if not path.exists():
        write_case_file(case, run_dir)
    return _command(choice, f"--case-file {path} --tp {case.tp_size}", mode)


def mode_args(config: RunConfig) -> tuple:
    """The options that make a reproducing run judge as this run did: its profile, its TP groups, its size tier,
    and the same kind of group; a profile file's content hash ends the command as a comment."""
    group: tuple
    if not config.in_process:
        group = ("--share-gpus",) if config.share_gpus else ()
    else:
        device = config.in_process_device
        chosen_device = ("--in-process-device", device) if device != "auto" else ()
        group = ("--in-process-group", config.in_process_group, *chosen_device)
    groups = ("--tp-groups", str(config.tp_groups)) if config.tp_groups > 1 else ()
    tier = ("--size-tier", config.size_tier) if config.size_tier != DEFAULT_TIER else ()
    return (*_profile_args(config.profile), *groups, *tier, *group)


def _profile_args(name: str) -> tuple:
    """``--profile NAME`` (whatever $SHARDSPEC_PROFILE says where it is run), or a user's profile file by its
    path, with the sha256 of the bytes the run was judged under, as read once when the profile was resolved
    (a comment: ``#`` and after is for the reader)."""
    source = profile_source(name) if is_profile(name) else None
    if source is None:
        return ("--profile", name)
    return ("--profile-file", source["path"], _COMMENT + source["sha256"])


_COMMENT = "# profile file sha256 "


def _command(choice: ImplChoice, selection: str, mode: tuple = ()) -> str:
    """The command; a comment among ``mode`` goes last, after the selection."""
    comments = [arg for arg in mode if arg.startswith(_COMMENT)]
    options = [arg for arg in mode if not arg.startswith(_COMMENT)]
    return " ".join(["python -m shardspec.conformance", *choice.cli_args(), *options, selection, *comments])
