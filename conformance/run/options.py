"""The run's options: one table (:data:`OPTIONS`), from which the command line, the pytest plugin and
the documentation's list are made (resolve.py validates them once per run).

Each option is declared once, as an :class:`Option` (option_type.py): its flag (``--tp``; the plugin's
is ``--shardspec-tp``), the environment variable it reads where the flag is not given
(``SHARDSPEC_TP``), its kind, how its text is parsed and checked (a reader of option_values.py), its
default and its help.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from shardspec.conformance.api import IMPL_ENV
from shardspec.conformance.run import option_values as read
from shardspec.conformance.run.option_type import Option
from shardspec.conformance.usage import (
    DEFAULT_MAX_EXAMPLES,
    GENERATED_POOL,
    MAX_EXAMPLES,
    MAX_TIMEOUT_S,
    MAX_TP_GROUPS,
    MIN_TIMEOUT_S,
    MIXED_MAX_EXAMPLES,
    SIZE_TIERS,
)
from shardspec.spec.profiles import DEFAULT_PROFILE, PROFILE_FILE_ENV, PROFILES

# Light imports only: the pytest plugin imports this module in every pytest session of an environment
# where shardspec is installed; the runner (and torch) load when a run is resolved (resolve.py).

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
        env=IMPL_ENV,
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
        "how rank processes start: torchrun, fork of one preloaded process per entry (CPU only; each entry's is "
        "forked from one process that imported torch and the suite, never an implementation), auto: fork on the "
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


if __name__ == "__main__":  # the guide's list: python -m shardspec.conformance.run.options
    print(markdown_table())
