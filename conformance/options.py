"""The run's options: one table (:data:`OPTIONS`), from which the command line, the pytest plugin and
the documentation's list are made, and :func:`resolve`, which validates them once per run.

Each option is declared once, as an :class:`Option` (option_type.py): its flag (``--tp``; the plugin's
is ``--shardspec-tp``), the environment variable it reads where the flag is not given
(``SHARDSPEC_TP``), its kind, how its text is parsed and checked (a reader of option_values.py), its
default and its help. A bad value is a
:class:`~shardspec.conformance.usage.UsageError` naming the option (or the variable it came from) and
what is wrong. A variable is read only where its option was not given, and an empty one counts as unset.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from shardspec.conformance import option_values as read
from shardspec.conformance.option_type import Option
from shardspec.conformance.output_paths import release_run_dir
from shardspec.conformance.usage import (
    DEFAULT_MAX_EXAMPLES,
    GENERATED_POOL,
    MAX_EXAMPLES,
    MAX_TIMEOUT_S,
    MAX_TP,
    MAX_TP_GROUPS,
    MIN_TIMEOUT_S,
    MIXED_MAX_EXAMPLES,
    SIZE_TIERS,
    UsageError,
)
from shardspec.spec.profiles import DEFAULT_PROFILE, PROFILE_FILE_ENV, PROFILES

if TYPE_CHECKING:
    from shardspec.conformance.runner import CaseSet, RunConfig

# Light imports only: the pytest plugin imports this module in every pytest session of an environment
# where shardspec is installed; the runner (and torch) load when a run is resolved.

QUICK_TP_SIZES = [2, 4]
QUICK_MAX_EXAMPLES = 10
DEFAULT_TP_SIZES = [1, 2, 3, 4, 8]
# Groups whose ranks are threads of one process (harness/inprocess.py, harness/threaded.py).
THREAD_GROUPS = ("lockstep", "torch-threads")
DEVICES = ("auto", "cpu", "cuda")
LAUNCHERS = ("auto", "torchrun", "fork", "external")


OPTIONS: tuple[Option, ...] = (
    Option(
        "impl",
        "--impl",
        "entries, comma-separated; each an implementation (reference, production, or package.module:attr) "
        "or A/B: even ranks run A, odd ranks B",
        parse=read.impl,
        default=["reference"],
        default_text="reference",
        env="SHARDSPEC_IMPL",
        metavar="ENTRIES",
    ),
    Option(
        "impl_odd",
        "--impl-odd",
        "shorthand: every entry A of --impl becomes the mixed entry A/B",
        parse=read.impl_odd,
        env="SHARDSPEC_IMPL_ODD",
        metavar="B",
    ),
    Option(
        "quick",
        "--quick",
        "tp 2,4 and 10 generated cases per size (about half a minute on 2 CPU cores for the three default entries)",
        kind="switch",
        default=False,
        env="SHARDSPEC_QUICK",
    ),
    Option(
        "tp",
        "--tp",
        "group sizes",
        parse=read.tp_sizes,
        default=lambda values: list(QUICK_TP_SIZES if values["quick"] else DEFAULT_TP_SIZES),
        default_text=",".join(map(str, DEFAULT_TP_SIZES)) + "; with --quick " + ",".join(map(str, QUICK_TP_SIZES)),
        env="SHARDSPEC_TP",
        metavar="LIST",
    ),
    Option(
        "profile_file",
        "--profile-file",
        "a profile of your own: a YAML file that extends a bundled profile and sets the rules it changes "
        "(spec/profiles/*.yaml, spec/rules.py); the run is judged under it unless --profile names another",
        parse=read.profile_file,
        env=PROFILE_FILE_ENV,
        metavar="FILE",
    ),
    Option(
        "profile",
        "--profile",
        f"the spec profile every case is judged under: {' or '.join(PROFILES)}, or the name of --profile-file's; "
        "see spec/SPEC.md, Profiles",
        parse=read.profile,
        default=lambda values: values["profile_file"] or DEFAULT_PROFILE,
        default_text=f"{DEFAULT_PROFILE}; with --profile-file, its profile",
        env="SHARDSPEC_PROFILE",
        metavar="NAME",
    ),
    Option(
        "max_examples",
        "--max-examples",
        f"generated cases per group size, at most {MAX_EXAMPLES}; fewer than {GENERATED_POOL} are the ones of "
        f"{GENERATED_POOL} drawn that draw the most of the input space beyond the fixtures",
        parse=read.bounded_examples,
        default=lambda values: QUICK_MAX_EXAMPLES if values["quick"] else DEFAULT_MAX_EXAMPLES,
        default_text=f"{DEFAULT_MAX_EXAMPLES}; with --quick {QUICK_MAX_EXAMPLES}",
        env="SHARDSPEC_MAX_EXAMPLES",
        metavar="N",
    ),
    Option(
        "mixed_max_examples",
        "--mixed-max-examples",
        "generated cases per group size of a mixed entry A/B, never more than --max-examples",
        parse=read.bounded_examples,
        default=MIXED_MAX_EXAMPLES,
        env="SHARDSPEC_MIXED_MAX_EXAMPLES",
        metavar="N",
    ),
    Option(
        "seed",
        "--seed",
        "seed of the generated cases; same seed, same cases",
        parse=lambda text, where: read.integer(text, where, 0),
        default=0,
        env="SHARDSPEC_SEED",
        metavar="S",
    ),
    Option(
        "fixtures_only", "--fixtures-only", "only the golden fixtures, no generated case", kind="switch", default=False
    ),
    Option(
        "case",
        "--case",
        "run this fixture case; with --case or --case-file the run is exactly the cases named (repeatable)",
        kind="repeat",
        default=[],
        metavar="ID",
    ),
    Option(
        "case_file", "--case-file", "run the case in this file (repeatable)", kind="repeat", default=[], metavar="PATH"
    ),
    Option("json", "--json", "write the JSON report here", parse=read.report_file, metavar="PATH"),
    Option(
        "xfails_file",
        "--xfails-file",
        "invariant IDs or case ids expected to fail (YAML list or mapping, or one per line)",
        parse=read.xfails,
        env="SHARDSPEC_XFAILS",
        metavar="PATH",
    ),
    Option(
        "timeout",
        "--timeout",
        f"seconds a case may make no progress on a rank before it counts as hung, {MIN_TIMEOUT_S:g} to "
        f"{MAX_TIMEOUT_S:g}",
        parse=read.seconds,
        default=60.0,
        env="SHARDSPEC_TIMEOUT",
        metavar="S",
    ),
    Option(
        "max_crashes",
        "--max-crashes",
        "after this many cases of one entry at one group size end alike (a rank died, or hung, in the same "
        "step, or its constructor raised the same error), its other cases there are not run, with that reason "
        "(where those cases' inputs are invalid, only its other invalid-input cases); 0 runs every case",
        parse=lambda text, where: read.integer(text, where, 0),
        default=3,
        env="SHARDSPEC_MAX_CRASHES",
        metavar="N",
    ),
    Option(
        "tp_groups",
        "--tp-groups",
        f"run each group size as this many TP groups of one world (tp x N rank processes, blocks of tp "
        f"consecutive ranks), as an engine runs TP inside data parallelism; each group runs every case and is "
        f"judged on its own, and a collective on any group but its TP group fails; at most {MAX_TP_GROUPS}",
        parse=lambda text, where: read.integer(text, where, 1, MAX_TP_GROUPS),
        default=1,
        env="SHARDSPEC_TP_GROUPS",
        metavar="N",
    ),
    Option(
        "pg_timeout",
        "--pg-timeout",
        f"the process-group timeout in seconds, {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:g}",
        parse=read.seconds,
        default=lambda values: values["timeout"],
        default_text="--timeout",
        metavar="S",
    ),
    Option(
        "in_process",
        "--in-process",
        "every rank as a thread of this process, taking turns (see --in-process-group); the checks then run "
        "in the implementation's process",
        kind="switch",
        default=False,
    ),
    Option(
        "in_process_group",
        "--in-process-group",
        "implies --in-process. lockstep: shardspec's own group, for implementations that use only the comm "
        "they are given; torch-threads: a torch.distributed group of torch's threaded backend, also for "
        "implementations that call torch.distributed",
        choices=THREAD_GROUPS,
        default_text=THREAD_GROUPS[0],
    ),
    Option(
        "in_process_device",
        "--in-process-device",
        "where in-process runs (and the shrinking of failures) put the ranks: cuda (one GPU, ranks take "
        "turns, compiled kernels), cpu, or auto: cuda where there is a GPU",
        choices=DEVICES,
        default="auto",
    ),
    Option(
        "size_tier",
        "--size-tier",
        "default: every fixture, boundary and generated case, and each size engines deploy (1024 requests, a "
        "151936-column vocabulary) once; deploy: only the sizes engines deploy, each at every group size, and "
        "larger ones (4096 requests, a 262144-column vocabulary)",
        choices=SIZE_TIERS,
        default=SIZE_TIERS[0],
        env="SHARDSPEC_SIZE_TIER",
    ),
    Option(
        "launcher",
        "--launcher",
        "how rank processes start: torchrun, fork of one preloaded process (CPU only), auto: fork on the "
        "CPU, torchrun on GPUs, or external: your own launcher (torchrun across nodes, srun) starts them "
        "with the printed command; needs one --tp and a --run-dir every node can read and write",
        choices=LAUNCHERS,
        default="auto",
        env="SHARDSPEC_LAUNCHER",
    ),
    Option(
        "share_gpus",
        "--share-gpus",
        "one process per rank on CUDA even where a group has more ranks than there are GPUs: rank r runs on "
        "GPU r % count and the collectives go through gloo (NCCL takes one rank per GPU); without it such a "
        "group runs on the CPU with Triton's interpreter",
        kind="switch",
        default=False,
    ),
    Option(
        "run_dir",
        "--run-dir",
        "keep the run's files (per-rank frame streams, launch logs) in this new or empty folder",
        parse=read.run_dir,
        metavar="DIR",
    ),
    Option(
        "robustness",
        "--robustness",
        "also send the cases outside the profile's contract (inputs its callers never send: spec/guarantees.py); "
        "their crashes, hangs and wrong outputs are reported as robustness findings, never as failures",
        kind="switch",
        default=False,
        env="SHARDSPEC_ROBUSTNESS",
    ),
    Option("no_shrink", "--no-shrink", "do not shrink failing generated cases", kind="switch", default=False),
    Option("verbose", "--verbose", "one line per case", kind="switch", default=False, short="-v"),
)
BY_NAME: dict[str, Option] = {option.name: option for option in OPTIONS}


def option(name: str) -> Option:
    return BY_NAME[name]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command line's options, one per entry of the table."""
    for entry in OPTIONS:
        flags = [entry.short, entry.flag] if entry.short else [entry.flag]
        parser.add_argument(*flags, dest=entry.name, **entry.parser_kwargs())


def add_plugin_options(group) -> None:
    """The plugin's options (``--shardspec-<flag>``) on a pytest option group, one per entry of the table."""
    for entry in OPTIONS:
        group.addoption(entry.plugin_flag, dest=entry.plugin_dest, **entry.parser_kwargs())


def given_any(given: Mapping[str, Any]) -> bool:
    """Whether any option of the table was given (a switch or a repeat not given is None)."""
    return any(given.get(entry.name) is not None for entry in OPTIONS)


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
        from shardspec.conformance.api import implementation_names

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
    from shardspec.conformance.runner import RunConfig, collect_cases

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
        profile=values["profile"],
        share_gpus=values["share_gpus"],
        robustness=values["robustness"],
    )
    for flag, wants_cuda in (
        ("--in-process-device cuda", config.in_process_device == "cuda"),
        ("--share-gpus", config.share_gpus),
    ):
        if wants_cuda:
            import torch

            if not torch.cuda.is_available():
                raise UsageError(f"{flag}: no CUDA device is available")
    return Resolved(config, collect_cases(config) if config.selected else None)


def markdown_table(options: Sequence[Option] = OPTIONS) -> str:
    """The options as the guide lists them (docs/validate-your-implementation.md)."""
    lines = ["| option | environment | meaning |", "| --- | --- | --- |"]
    for entry in options:
        spelling = entry.flag
        if entry.choices:
            spelling += " " + "\\|".join(entry.choices)
        elif entry.kind != "switch":
            spelling += f" {entry.metavar}"
        if entry.short:
            spelling = f"{entry.short}`, `{spelling}"
        meaning = entry.help + (f" (default {entry.shown_default})" if entry.shown_default is not None else "")
        env = f"`{entry.env}`" if entry.env else ""
        meaning = meaning.replace("|", "\\|")
        lines.append(f"| `{spelling}` | {env} | {meaning} |")
    return "\n".join(lines)


if __name__ == "__main__":  # the guide's list: python -m shardspec.conformance.options
    print(markdown_table())
