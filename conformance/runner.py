"""A whole conformance run: choose cases, run them per group size, judge, report."""

from __future__ import annotations

import functools
import pathlib
import shutil
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.harness.group import Group, Job
from shardspec.conformance.record import ERROR, FAIL, NOT_RUN, CaseResult, not_run
from shardspec.conformance.reproduce import (
    annotate,
    mode_args,
    prepare_reproduction,
    reproduce_command,
    write_case_file,
)
from shardspec.conformance.usage import (
    DEFAULT_MAX_EXAMPLES,
    DEFAULT_TIER,
    DEPLOY_TIER,
    GENERATED_POOL,
    MIXED_MAX_EXAMPLES,
)
from shardspec.spec.case import Case
from shardspec.spec.guarantees import Breach, broken_guarantee
from shardspec.spec.model import DEFAULT_PROFILE
from shardspec.spec.profiles import rules_of

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
    # The profile every case is judged under (spec/index.yaml).
    profile: str = DEFAULT_PROFILE
    # "default": each size engines deploy once among the run's cases; "deploy": only those sizes, every one at every
    # group size, and larger ones (cases/deployment.py).
    size_tier: str = DEFAULT_TIER
    # Rank processes on CUDA where a group has more ranks than GPUs: GPUs shared, collectives on gloo.
    share_gpus: bool = False
    # Send the cases outside the profile's contract too (spec/guarantees.py): what they end in is reported as
    # robustness findings, never as conformance failures.
    robustness: bool = False

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


def collect_cases(config: RunConfig) -> CaseSet:
    notes: list[str] = []
    if config.selected:
        from shardspec.conformance.cases.limits import checked_case, checked_case_file, checked_case_id
        from shardspec.fixtures import load_case, load_case_file

        from_files = {
            path: checked_case(
                _under_profile(_loaded(load_case_file, checked_case_file(path), "--case-file"), config.profile, path),
                f"--case-file {path}",
            )
            for path in config.case_files
        }
        named = [
            checked_case(
                _loaded(lambda i: load_case(i, config.profile), checked_case_id(case_id), "--case"), f"--case {case_id}"
            )
            for case_id in config.case_ids
        ]
        cases = _unique_ids(named + list(from_files.values()))
        files = {case.case_id: str(pathlib.Path(path).resolve()) for path, case in from_files.items()}
        steps, parents = _expanded(cases)
        files.update({step_id: files[parent.case_id] for step_id, parent in parents.items() if parent.case_id in files})
        for step in steps:  # a case the reference contradicts would be judged by no checker, yet read pass
            where = f"--case-file {files[step.case_id]}" if step.case_id in files else f"--case {step.case_id}"
            _agrees_with_reference(step, where, config.case_timeout_s)
        return CaseSet(steps, set(), notes, files, parents, outside=_outside(steps, parents, config.profile))
    if config.size_tier == DEPLOY_TIER:
        return _deploy_tier(config, notes)
    cases = [c for c in _fixture_cases(notes, config.profile) if c.tp_size in config.tp_sizes]
    generated: list[Case] = []
    at_boundaries: list[Case] = []
    deployed: list[Case] = []
    if not config.fixtures_only and config.max_examples > 0:
        from shardspec.conformance.cases.boundaries import boundary_cases_for_run
        from shardspec.conformance.cases.deployment import deployment_cases_for_run
        from shardspec.conformance.cases.multistep import multi_step_cases
        from shardspec.conformance.cases.spread import most_drawing
        from shardspec.conformance.cases.strategies import generate_cases

        rules = rules_of(config.profile)
        for tp in config.tp_sizes:
            made = boundary_cases_for_run(tp, config.profile, config.seed, config.tp_sizes)
            # Only what the profile's callers send, but where a robustness run sends the rest too.
            at_boundaries += [c for c in made if config.robustness or broken_guarantee(c, rules) is None]
            if tp < rules_of(config.profile).min_tp:
                continue  # a group the profile builds no sharder for: its rejection is the one case
            deployed += deployment_cases_for_run(tp, config.profile, config.seed, config.tp_sizes)
            multi = multi_step_cases(tp, max(1, config.max_examples // MULTI_STEP_SHARE), config.seed, config.profile)
            # The generated cases chosen to draw what the fixtures and the multi-step cases do not.
            pool = generate_cases(tp, max(config.max_examples, GENERATED_POOL), config.seed, config.profile)
            generated += most_drawing(pool, config.max_examples, [c for c in cases if c.tp_size == tp] + multi)
            cases += multi
    notes += _refused_sizes(config)
    steps, parents = _expanded(_unique_ids(cases + at_boundaries + deployed + generated))
    made = {c.case_id for c in steps}
    generated_ids = {c.case_id for c in generated} & made
    boundary_ids = {c.case_id for c in at_boundaries} & made
    outside = _outside(steps, parents, config.profile)
    case_set = CaseSet(steps, generated_ids, notes, parents=parents, boundary=boundary_ids, outside=outside)
    case_set.deployed = {c.case_id for c in deployed} & made
    case_set.for_mixed = _chosen_for_mixed(case_set, config)
    return case_set


def _deploy_tier(config: RunConfig, notes: list[str]) -> CaseSet:
    """--size-tier deploy: the deploy tier's cases at each of the run's sizes the profile builds a sharder for, and
    no other case (the default tier runs the rest)."""
    from shardspec.conformance.cases.deployment import deployment_cases_for_run

    deployed = [
        case
        for tp in config.tp_sizes
        for case in deployment_cases_for_run(tp, config.profile, config.seed, config.tp_sizes, config.size_tier)
    ]
    sizes = sorted({case.tp_size for case in deployed})
    notes.append(f"size tier deploy: only the sizes engines deploy, at tp {', '.join(map(str, sizes)) or 'none'}")
    case_set = CaseSet(deployed, set(), notes, outside=_outside(deployed, {}, config.profile))
    case_set.deployed = {case.case_id for case in deployed}
    return case_set


def _outside(steps: list[Case], parents: dict[str, Case], profile: str) -> dict[str, Breach]:
    """Each case (a step: its whole case) that breaks a guarantee of ``profile``'s callers, with the guarantee."""
    rules = rules_of(profile)
    found = {step.case_id: broken_guarantee(parents.get(step.case_id, step), rules) for step in steps}
    return {case_id: breach for case_id, breach in found.items() if breach is not None}


def _refused_sizes(config: RunConfig) -> list[str]:
    """A note for each group size of the run the profile builds no sharder for (PRE-TP-SIZE): there only
    that rejection is judged, never a valid case, and the run says so rather than judging them silently."""
    least = rules_of(config.profile).min_tp
    small = [tp for tp in config.tp_sizes if tp < least]
    if not small:
        return []
    return [
        f"profile {config.profile} builds no sharder for a group of {', '.join(map(str, small))} (PRE-TP-SIZE): "
        f"at tp {', '.join(map(str, small))} only that rejection is judged; valid cases run at tp {least} or more"
    ]


# One multi-step case (five steps on one sharder) per this many generated single-step cases.
MULTI_STEP_SHARE = 50


def _expanded(cases: list[Case]) -> tuple[list[Case], dict[str, Case]]:
    """Multi-step cases replaced by their steps (consecutive, in order), and each step's whole case."""
    from shardspec.spec.case import expand_steps

    steps, parents = [], {}
    for case in cases:
        expanded = expand_steps(case)
        steps += expanded
        if case.then:
            parents.update({step.case_id: case for step in expanded})
    return steps, parents


def _loaded(load, name: str, option: str) -> Case:
    from shardspec.conformance.usage import UsageError

    try:
        return load(name)
    except (ValueError, KeyError, OSError) as exc:  # the loaders name the file, field and problem
        raise UsageError(f"{option} {name}: {exc}") from None
    except RecursionError:  # YAML's parser recurses once per level of nesting
        raise UsageError(f"{option} {name}: nested too deeply to be a case file") from None


def _agrees_with_reference(case: Case, where: str, timeout_s: float) -> None:
    """A UsageError unless the reference raises exactly where ``case`` says (harness/expectations.py,
    contradiction). Checked on the CPU."""
    from shardspec.conformance.harness.expectations import contradiction
    from shardspec.conformance.usage import UsageError

    problem = contradiction(case, timeout_s, "cpu")
    if problem is not None:
        raise UsageError(f"{where}: {problem}")


def _fixture_cases(notes: list[str], profile: str) -> list[Case]:
    try:
        from shardspec.fixtures import load_cases
    except ImportError as exc:
        notes.append(f"no golden fixtures: shardspec.fixtures is not importable ({exc})")
        return []
    return load_cases(profile)


def _under_profile(case: Case, profile: str, path: str) -> Case:
    """A case file's case under the run's profile; a UsageError if it does not hold for it."""
    from shardspec.conformance.usage import UsageError
    from shardspec.fixtures.catalogue import case_profiles, with_profile

    if profile not in case_profiles(case, (profile,)):
        raise UsageError(
            f"--case-file {path}: the case holds for profile(s) {', '.join(case_profiles(case))}, not {profile} "
            "(--profile)"
        )
    return with_profile(case, profile)


def _unique_ids(cases: list[Case]) -> list[Case]:
    seen: dict[str, int] = {}
    unique = []
    for case in cases:
        count = seen.get(case.case_id, 0)
        seen[case.case_id] = count + 1
        unique.append(case if count == 0 else replace(case, case_id=f"{case.case_id}~{count}"))
    return unique


def tp_sizes_of(config: RunConfig, cases: list[Case]) -> list[int]:
    return sorted({c.tp_size for c in cases}) if config.selected else list(config.tp_sizes)


def cases_of_entry(config: RunConfig, choice: ImplChoice, case_set: CaseSet, tp: int) -> list[Case]:
    """The cases ``choice`` runs at group size ``tp``: none where it does not apply. A mixed entry
    runs the fixtures, but only ``mixed_max_examples`` generated cases and one multi-step case (those
    that draw the most of the input space beyond the fixtures: cases/spread.py), no case made at a
    precondition's boundary (each single entry checks its own rejection), and no case whose inputs
    break a precondition with undefined behaviour: two implementations may answer those differently,
    even leave each other in a collective, and both be right."""
    if not choice.applies_to(tp):
        return []
    sent = config.robustness and not choice.mixed  # a robustness run sends what the profile's callers never do
    cases = [c for c in case_set.cases if c.tp_size == tp and (sent or c.case_id not in case_set.outside)]
    if not choice.mixed or config.selected:
        return cases
    made = case_set.generated | set(case_set.parents)
    dropped = {c.case_id for c in cases if c.case_id in made and c.case_id not in case_set.for_mixed}
    dropped |= {c.case_id for c in cases if undefined_behaviour(c)}
    dropped |= case_set.boundary  # each implementation's own rejection: its single entry checks it
    return [c for c in cases if c.case_id not in dropped]


def _chosen_for_mixed(case_set: CaseSet, config: RunConfig) -> set[str]:
    """:data:`CaseSet.for_mixed`, from the cases a mixed entry may run (none of undefined behaviour)."""
    from shardspec.conformance.cases.spread import chosen_for_few

    runnable = [c for c in case_set.cases if not undefined_behaviour(c) and c.case_id not in case_set.outside]
    steps_of = {step: parent.case_id for step, parent in case_set.parents.items()}
    made = case_set.generated | set(case_set.parents) | case_set.boundary
    return chosen_for_few(runnable, case_set.generated, steps_of, made, config.mixed_max_examples)


def undefined_behaviour(case: Case) -> bool:
    """The case breaks a precondition the spec leaves undefined (not one that MUST be rejected)."""
    return case.expect_error is not None and case.expect_error not in _must_reject()


@functools.lru_cache(maxsize=1)
def _must_reject() -> frozenset[str]:
    from shardspec.spec.loader import must_reject_ids

    return frozenset(must_reject_ids())


def run_group_size(
    config: RunConfig,
    entries: list[str],
    case_set: CaseSet,
    run_dir: pathlib.Path,
    log: Log,
    tp: int,
    load_problems: dict[str, str | None],
    results: dict[str, list[CaseResult]],
    group: Group,
) -> None:
    """Every entry's cases of group size ``tp``, appended to ``results[entry]`` as they are judged (an
    interrupted run keeps them); in the multi-process mode each entry runs in rank processes of its
    own (harness/multiprocess.py). ``load_problems``: why an implementation cannot be loaded
    (see :func:`shardspec.conformance.harness.probe.probe`)."""
    start = {entry: len(results[entry]) for entry in entries}
    prepare_reproduction(case_set, run_dir)
    jobs, owners = [], []
    for entry in entries:
        choice = ImplChoice.parse(entry)
        cases = cases_of_entry(config, choice, case_set, tp)
        problem = next((load_problems[name] for name in choice.names() if load_problems.get(name)), None)
        if problem:
            log(f"cannot run {choice.label}: {problem}")
            results[entry] += [
                annotate(config, choice, not_run(case, choice.label, problem), case_set, run_dir) for case in cases
            ]
            continue
        jobs += [Job(choice, case) for case in cases]
        owners += [entry] * len(cases)
    if jobs:
        entry_of = {ImplChoice.parse(entry).label: entry for entry in entries}
        delivered: set[int] = set()

        def deliver(result: CaseResult) -> None:
            delivered.add(id(result))
            annotate(config, ImplChoice.parse(entry_of[result.impl]), result, case_set, run_dir)
            results[entry_of[result.impl]].append(result)

        for entry, result in zip(owners, _run_jobs(config, group, tp, jobs, log, deliver), strict=False):
            if id(result) not in delivered:  # not run: never delivered on the way
                results[entry].append(annotate(config, ImplChoice.parse(entry), result, case_set, run_dir))
    for entry in entries:
        _finish_results(config, ImplChoice.parse(entry), results[entry][start[entry] :], case_set, run_dir, log)


def _finish_results(config, choice, results, case_set, run_dir, log) -> None:
    """Shrink failing generated cases; every result says how to reproduce it."""
    for result in results:
        annotate(config, choice, result, case_set, run_dir)
    results = [r for r in results if not r.outside]  # a robustness finding is reported, not shrunk
    _shrink_failures(config, choice, results, case_set.generated, run_dir, log)


def _run_jobs(config, group: Group, tp, jobs, log, deliver) -> list[CaseResult]:
    start = time.perf_counter()

    def on_result(result: CaseResult) -> None:
        deliver(result)
        if config.verbose or result.status in (FAIL, ERROR):
            log(f"    {result.status:7s} {result.case_id} (tp {tp}, {result.impl})")

    from shardspec.conformance.replay import suite_judge

    results = group.run(jobs, tp, suite_judge(config.pg_timeout_s), on_result)
    for label in dict.fromkeys(job.choice.label for job in jobs):
        mine = [r for r in results if r.impl == label]
        counts = {s: sum(r.status == s for r in mine) for s in ("pass", FAIL, ERROR, NOT_RUN)}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        log(f"  tp {tp}, {label}: {len(mine)} case(s): {summary}")
    log(f"  tp {tp}: {len(results)} job(s) in {time.perf_counter() - start:.1f}s")
    return results


def _shrink_failures(config, choice, results, generated, run_dir, log) -> None:
    from shardspec.conformance.cases.shrink import shrinkable, signature
    from shardspec.conformance.replay import shrink_in_child

    failing = [r for r in results if r.case_id in generated and r.status in (FAIL, ERROR)]
    done: set[frozenset] = set()  # one minimal case per kind of failure
    for result in failing:
        kind = frozenset(signature(result))
        if not config.shrink or len(done) >= config.max_shrinks or kind in done or not shrinkable(result):
            continue
        done.add(kind)
        log(f"  shrinking {result.case_id} in a child process ...")
        try:
            outcome = shrink_in_child(
                result.case,
                set(kind),
                choice.label,
                config.in_process_group,
                config.in_process_device,
                run_dir / "shrinking",
            )
        except RuntimeError as exc:  # the failure is still reported, unshrunk
            result.shrunk = f"not shrunk: {exc}"
            log(f"  could not shrink {result.case_id}: {exc}")
            continue
        result.shrunk = outcome.describe(set(kind))
        if not outcome.simplifications:  # the reproduce command stays the case's own
            log(f"  could not shrink {result.case_id}: {result.shrunk}")
            continue
        path = write_case_file(outcome.case, run_dir)
        result.reproduce = reproduce_command(choice, outcome.case, True, run_dir, mode_args(config))
        log(f"  minimal failing case ({path}), {result.shrunk}:")
        log(textwrap.indent(path.read_text().rstrip(), "    | "))
        log(f"  reproduce: {result.reproduce}")


def make_run_dir(config: RunConfig) -> tuple[pathlib.Path, bool]:
    """The run directory, and whether it is a temporary one (removed after a clean run)."""
    if config.run_dir is not None:
        config.run_dir.mkdir(parents=True, exist_ok=True)
        return config.run_dir, False
    return pathlib.Path(tempfile.mkdtemp(prefix="shardspec-conformance-")), True


def remove_run_dir(path: pathlib.Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
