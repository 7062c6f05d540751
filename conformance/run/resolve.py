"""A run's options resolved once per run: each option's value from the command line or the plugin, else its
variable, else its default (the table of options.py), checked, then the rules between options; and the
cases the run names, loaded.

A bad value is a :class:`~shardspec.conformance.usage.UsageError` naming the option (or the variable it
came from) and what is wrong. A variable is read only where its option was not given, and an empty one
counts as unset.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from shardspec.conformance.api import implementation_names
from shardspec.conformance.output_paths import release_run_dir
from shardspec.conformance.run.collect import collect_cases
from shardspec.conformance.run.config import CaseSet, RunConfig
from shardspec.conformance.run.options import OPTIONS, THREAD_GROUPS
from shardspec.conformance.usage import MAX_TP, UsageError
from shardspec.spec.profiles import rules_of


def resolve(given: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Every option's value by name: the option as given (None: not given), else its variable, else its
    default; each checked, then the rules between options. A run dir claimed before a usage error is given
    back unused (the corrected command may take it)."""
    values: dict[str, Any] = {}
    try:
        return _resolve(given, environ, values)
    except UsageError:
        _give_back_run_dir(values)
        raise


def _give_back_run_dir(values: Mapping[str, Any]) -> None:
    if values.get("run_dir") is not None:
        release_run_dir(values["run_dir"], unused=True)


def _resolve(given: Mapping[str, Any], environ: Mapping[str, str], values: dict[str, Any]) -> dict[str, Any]:
    for entry in OPTIONS:
        raw, where = given.get(entry.name), entry.flag
        if raw is None and entry.env is not None:
            raw, where = environ.get(entry.env) or None, f"${entry.env}"
        if raw is not None:
            values[entry.name] = entry.read(raw, where)
    for entry in sorted((e for e in OPTIONS if e.name not in values), key=lambda e: callable(e.default)):
        default = entry.default(values) if callable(entry.default) else entry.default
        values[entry.name] = list(default) if isinstance(default, list) else default
    values["mixed_max_examples"] = min(values["max_examples"], values["mixed_max_examples"])
    if values["impl_odd"]:
        values["impl"] = implementation_names(",".join(values["impl"]), values["impl_odd"])
    values["in_process"] = values["in_process"] or values["in_process_group"] is not None
    values["in_process_group"] = values["in_process_group"] or THREAD_GROUPS[0]
    if values["tp_groups"] > 1 and values["in_process"]:
        raise UsageError("--tp-groups: several TP groups run only as rank processes, not --in-process")
    if max(values["tp"]) * values["tp_groups"] > MAX_TP:
        raise UsageError(
            f"--tp-groups {values['tp_groups']}: a world of {max(values['tp'])} x {values['tp_groups']} "
            f"ranks is above {MAX_TP}"
        )
    if values["launcher"] == "external":
        if values["tp_groups"] > 1:
            raise UsageError(
                "--tp-groups with --launcher external: your launcher's world size says how many TP "
                "groups run (the suite splits a larger world into blocks of --tp ranks)"
            )
        if len(values["tp"]) != 1:
            raise UsageError(f"--launcher external: one group size (the launch's world size), not {values['tp']}")
        if values["run_dir"] is None:
            raise UsageError("--launcher external: give a --run-dir that every node can read and write")
    if values["share_gpus"] and (values["in_process"] or values["launcher"] in ("fork", "external")):
        raise UsageError(
            "--share-gpus: rank processes that the suite starts with torchrun (not --in-process, --launcher "
            "fork or external)"
        )
    return values


@dataclass(frozen=True)
class Resolved:
    """A run's options, checked, and the cases they name, loaded: both once per run."""

    config: RunConfig
    cases: CaseSet | None  # None where no case is named: the session collects fixtures and generated cases

    def with_verbose(self) -> Resolved:
        return self if self.config.verbose else replace(self, config=replace(self.config, verbose=True))


def resolve_run(given: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Resolved:
    """The run's configuration and its named cases; a UsageError (naming the option, variable or case
    file) on a bad value, before anything is launched."""
    values = resolve(given, environ)
    try:
        return _resolved(values)
    except UsageError:
        _give_back_run_dir(values)
        raise


def _resolved(values: dict[str, Any]) -> Resolved:
    config = RunConfig(
        impls=values["impl"],
        tp_sizes=values["tp"],
        seed=values["seed"],
        max_examples=values["max_examples"],
        mixed_max_examples=values["mixed_max_examples"],
        fixtures_only=values["fixtures_only"],
        case_ids=values["case"],
        case_files=values["case_file"],
        case_timeout_s=values["timeout"],
        pg_timeout_s=values["pg_timeout"],
        max_crashes=values["max_crashes"],
        tp_groups=values["tp_groups"],
        size_tier=values["size_tier"],
        in_process=values["in_process"],
        in_process_group=values["in_process_group"],
        launcher=values["launcher"],
        run_dir=values["run_dir"],
        shrink=not values["no_shrink"],
        verbose=values["verbose"],
        in_process_device=values["in_process_device"],
        xfails_file=values["xfails_file"],
        json_path=values["json"],
        rules=rules_of(values["profile"]),
        share_gpus=values["share_gpus"],
        robustness=values["robustness"],
    )
    for flag, wants_cuda in (
        ("--in-process-device cuda", config.in_process_device == "cuda"),
        ("--share-gpus", config.share_gpus),
    ):
        if wants_cuda:
            if not torch.cuda.is_available():
                raise UsageError(f"{flag}: no CUDA device is available")
    return Resolved(config, collect_cases(config) if config.selected else None)
