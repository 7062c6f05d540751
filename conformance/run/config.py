"""A run's configuration (:class:`RunConfig`) and its cases (:class:`CaseSet`): plain data that the options,
the runner, the session and the reproduce commands share, so none of them imports another for it."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field

from shardspec.conformance.usage import DEFAULT_MAX_EXAMPLES, DEFAULT_TIER, MIXED_MAX_EXAMPLES
from shardspec.spec.case import Case
from shardspec.spec.guarantees import Breach
from shardspec.spec.profiles import default_rules
from shardspec.spec.rules import Rules

ALL_TP_SIZES = [1, 2, 3, 4, 8]
Log = Callable[[str], None]


@dataclass
class RunConfig:
    impls: list[str] = field(default_factory=lambda: ["reference"])  # entries: "A" or "A/B"
    tp_sizes: list[int] = field(default_factory=lambda: list(ALL_TP_SIZES))
    seed: int = 0
    max_examples: int = DEFAULT_MAX_EXAMPLES  # generated cases judged per group size
    # Mixed entries mostly test the wire layout between implementations, which
    # the fixtures and a few generated cases already cover.
    mixed_max_examples: int = MIXED_MAX_EXAMPLES
    fixtures_only: bool = False
    case_ids: list[str] = field(default_factory=list)
    case_files: list[str] = field(default_factory=list)
    case_timeout_s: float = 60.0
    pg_timeout_s: float = 60.0
    # Cases of one entry at one group size that end alike (a rank died or hung in the same step) before its
    # other cases there are not run (harness/crashes.py); 0: every case runs.
    max_crashes: int = 3
    # TP groups in each launched world (blocks of tp consecutive ranks, each running and judged on every case).
    tp_groups: int = 1
    in_process: bool = False
    # Which in-process group: "lockstep" (shardspec's own) or "torch-threads" (torch's threaded backend).
    in_process_group: str = "lockstep"
    # How rank processes start: "torchrun", "fork" (CPU only), or "auto"
    # (fork on the CPU, where starting ranks dominates; torchrun on GPUs).
    launcher: str = "auto"
    run_dir: pathlib.Path | None = None
    shrink: bool = True
    max_shrinks: int = 3  # kinds of failure whose generated cases are shrunk, per implementation
    verbose: bool = False
    in_process_device: str = "auto"  # auto | cpu | cuda
    xfails_file: str | None = None
    json_path: str | None = None
    # The rules of the profile every case is judged under (spec/index.yaml), resolved from its name by the options.
    rules: Rules = field(default_factory=default_rules)
    # "default": each size engines deploy once among the run's cases; "deploy": only those sizes, every one at every
    # group size, and larger ones (cases/deployment.py).
    size_tier: str = DEFAULT_TIER
    # Rank processes on CUDA where a group has more ranks than GPUs: GPUs shared, collectives on gloo.
    share_gpus: bool = False
    # Send the cases outside the profile's contract too (spec/guarantees.py): what they end in is reported as
    # robustness findings, never as conformance failures.
    robustness: bool = False

    @property
    def profile(self) -> str:
        """The name of the run's profile (reports, reproduce commands)."""
        return self.rules.profile

    @property
    def selected(self) -> bool:
        """Cases were named explicitly: run exactly those."""
        return bool(self.case_ids or self.case_files)


@dataclass
class CaseSet:
    cases: list[Case]
    generated: set[str]
    notes: list[str]
    files: dict[str, str] = field(default_factory=dict)  # case id -> the --case-file it came from
    # The steps of multi-step cases, run as cases of their own: step id -> the whole case.
    parents: dict[str, Case] = field(default_factory=dict)
    # Cases made from the preconditions' boundaries (cases/boundaries.py): made in the run like generated
    # cases, so reproduced from a written file, but not shrunk (each is already one violation).
    boundary: set[str] = field(default_factory=set)
    # Cases at the sizes engines deploy (cases/deployment.py): made in the run, so reproduced from a written
    # file; run by mixed entries too, as the fixtures are.
    deployed: set[str] = field(default_factory=set)
    # The generated cases and the multi-step case (its steps) a mixed entry runs at each size: those that
    # draw the most of the input space beyond the fixtures (cases/spread.py).
    for_mixed: set[str] = field(default_factory=set)
    # Case id -> what selects it in a reproduce command (``--case ID``, ``--case-file PATH --tp N``), made
    # before any case runs (:func:`prepare_reproduction`), so an interrupted run still says how to reproduce.
    selections: dict[str, str] = field(default_factory=dict)
    # Case id -> the guarantee of the run's profile it breaks (a step: its whole case's): outside the contract,
    # run only by a robustness run (spec/guarantees.py).
    outside: dict[str, Breach] = field(default_factory=dict)
