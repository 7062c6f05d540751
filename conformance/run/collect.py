"""The cases of a run: the fixtures, the cases made at the preconditions' boundaries, at the sizes engines
deploy and generated, or exactly the cases named; and which of them each entry runs."""

from __future__ import annotations

import functools
import pathlib
from dataclasses import replace

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.cases.boundaries import boundary_cases_for_run
from shardspec.conformance.cases.deployment import deployment_cases_for_run
from shardspec.conformance.cases.limits import checked_case, checked_case_file, checked_case_id
from shardspec.conformance.cases.multistep import multi_step_cases
from shardspec.conformance.cases.spread import chosen_for_few, most_drawing
from shardspec.conformance.harness.expectations import contradiction
from shardspec.conformance.run.config import CaseSet, RunConfig
from shardspec.conformance.usage import DEPLOY_TIER, GENERATED_POOL, UsageError
from shardspec.fixtures import load_case, load_case_file, load_cases
from shardspec.fixtures.catalogue import case_rules, with_profile
from shardspec.fixtures.holding import holds_under
from shardspec.spec.case import Case, expand_steps
from shardspec.spec.guarantees import Breach, broken_guarantee
from shardspec.spec.loader import must_reject_ids
from shardspec.spec.rules import Rules


def collect_cases(config: RunConfig) -> CaseSet:
    notes: list[str] = []
    if config.selected:
        from_files = {
            path: checked_case(
                _under_profile(_loaded(load_case_file, checked_case_file(path), "--case-file"), config.rules, path),
                f"--case-file {path}",
            )
            for path in config.case_files
        }
        named = [
            checked_case(
                _loaded(lambda i: load_case(i, config.rules), checked_case_id(case_id), "--case"), f"--case {case_id}"
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
        return CaseSet(steps, set(), notes, files, parents, outside=_outside(steps, parents, config.rules))
    if config.size_tier == DEPLOY_TIER:
        return _deploy_tier(config, notes)
    cases = [c for c in load_cases(config.rules) if c.tp_size in config.tp_sizes]
    generated: list[Case] = []
    at_boundaries: list[Case] = []
    deployed: list[Case] = []
    if not config.fixtures_only and config.max_examples > 0:
        # hypothesis (the test extra) draws the generated cases: a run of named cases or fixtures needs none
        from shardspec.conformance.cases.strategies import generate_cases

        for tp in config.tp_sizes:
            made = boundary_cases_for_run(tp, config.rules, config.seed, config.tp_sizes)
            # Only what the profile's callers send, but where a robustness run sends the rest too.
            at_boundaries += [c for c in made if config.robustness or broken_guarantee(c, config.rules) is None]
            if tp < config.rules.min_tp:
                continue  # a group the profile builds no sharder for: its rejection is the one case
            deployed += deployment_cases_for_run(tp, config.rules, config.seed, config.tp_sizes)
            multi = multi_step_cases(tp, max(1, config.max_examples // MULTI_STEP_SHARE), config.seed, config.rules)
            # The generated cases chosen to draw what the fixtures and the multi-step cases do not.
            pool = generate_cases(tp, max(config.max_examples, GENERATED_POOL), config.seed, config.rules)
            generated += most_drawing(pool, config.max_examples, [c for c in cases if c.tp_size == tp] + multi)
            cases += multi
    notes += _refused_sizes(config)
    steps, parents = _expanded(_unique_ids(cases + at_boundaries + deployed + generated))
    made = {c.case_id for c in steps}
    generated_ids = {c.case_id for c in generated} & made
    boundary_ids = {c.case_id for c in at_boundaries} & made
    outside = _outside(steps, parents, config.rules)
    case_set = CaseSet(steps, generated_ids, notes, parents=parents, boundary=boundary_ids, outside=outside)
    case_set.deployed = {c.case_id for c in deployed} & made
    case_set.for_mixed = _chosen_for_mixed(case_set, config)
    return case_set


def _deploy_tier(config: RunConfig, notes: list[str]) -> CaseSet:
    """--size-tier deploy: the deploy tier's cases at each of the run's sizes the profile builds a sharder for, and
    no other case (the default tier runs the rest)."""
    deployed = [
        case
        for tp in config.tp_sizes
        for case in deployment_cases_for_run(tp, config.rules, config.seed, config.tp_sizes, config.size_tier)
    ]
    sizes = sorted({case.tp_size for case in deployed})
    notes.append(f"size tier deploy: only the sizes engines deploy, at tp {', '.join(map(str, sizes)) or 'none'}")
    case_set = CaseSet(deployed, set(), notes, outside=_outside(deployed, {}, config.rules))
    case_set.deployed = {case.case_id for case in deployed}
    return case_set


def _outside(steps: list[Case], parents: dict[str, Case], rules: Rules) -> dict[str, Breach]:
    """Each case (a step: its whole case) that breaks a guarantee of the callers of ``rules``, with the guarantee."""
    found = {step.case_id: broken_guarantee(parents.get(step.case_id, step), rules) for step in steps}
    return {case_id: breach for case_id, breach in found.items() if breach is not None}


def _refused_sizes(config: RunConfig) -> list[str]:
    """A note for each group size of the run the profile builds no sharder for (PRE-TP-SIZE): there only
    that rejection is judged, never a valid case, and the run says so rather than judging them silently."""
    least = config.rules.min_tp
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
    steps, parents = [], {}
    for case in cases:
        expanded = expand_steps(case)
        steps += expanded
        if case.then:
            parents.update({step.case_id: case for step in expanded})
    return steps, parents


def _loaded(load, name: str, option: str) -> Case:
    try:
        return load(name)
    except (ValueError, KeyError, OSError) as exc:  # the loaders name the file, field and problem
        raise UsageError(f"{option} {name}: {exc}") from None
    except RecursionError:  # YAML's parser recurses once per level of nesting
        raise UsageError(f"{option} {name}: nested too deeply to be a case file") from None


def _agrees_with_reference(case: Case, where: str, timeout_s: float) -> None:
    """A UsageError unless the reference raises exactly where ``case`` says (harness/expectations.py,
    contradiction). Checked on the CPU."""
    problem = contradiction(case, timeout_s, "cpu")
    if problem is not None:
        raise UsageError(f"{where}: {problem}")


def _under_profile(case: Case, rules: Rules, path: str) -> Case:
    """A case file's case under the run's profile; a UsageError if it does not hold for it."""
    if not holds_under(rules, case):
        held = ", ".join(held.profile for held in case_rules(case))
        raise UsageError(f"--case-file {path}: the case holds for profile(s) {held}, not {rules.profile} (--profile)")
    return with_profile(case, rules)


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
    runnable = [c for c in case_set.cases if not undefined_behaviour(c) and c.case_id not in case_set.outside]
    steps_of = {step: parent.case_id for step, parent in case_set.parents.items()}
    made = case_set.generated | set(case_set.parents) | case_set.boundary
    return chosen_for_few(runnable, case_set.generated, steps_of, made, config.mixed_max_examples)


def undefined_behaviour(case: Case) -> bool:
    """The case breaks a precondition the spec leaves undefined (not one that MUST be rejected)."""
    return case.expect_error is not None and case.expect_error not in _must_reject()


@functools.lru_cache(maxsize=1)
def _must_reject() -> frozenset[str]:
    return frozenset(must_reject_ids())
