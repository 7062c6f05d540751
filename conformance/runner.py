"""A whole conformance run: choose cases, run them per group size, judge, report."""

from __future__ import annotations

import pathlib
import shutil
import tempfile
import textwrap
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from shardspec.conformance.api import ImplChoice, ImplementationError, load_implementation
from shardspec.conformance.launcher import LaunchOptions, run_cases_multiprocess
from shardspec.conformance.results import ERROR, FAIL, NOT_RUN, CaseResult, not_run
from shardspec.spec.case import Case

ALL_TP_SIZES = [1, 2, 3, 4, 8]
Log = Callable[[str], None]


@dataclass
class RunConfig:
    impls: list[str] = field(default_factory=lambda: ["reference"])
    impl_odd: Optional[str] = None
    tp_sizes: list[int] = field(default_factory=lambda: list(ALL_TP_SIZES))
    seed: int = 0
    max_examples: int = 100  # generated cases per group size
    fixtures_only: bool = False
    case_ids: list[str] = field(default_factory=list)
    case_files: list[str] = field(default_factory=list)
    case_timeout_s: float = 60.0
    pg_timeout_s: float = 60.0
    in_process: bool = False
    run_dir: Optional[pathlib.Path] = None
    shrink: bool = True
    max_shrinks: int = 3  # kinds of failure whose generated cases are shrunk, per implementation
    verbose: bool = False

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


def collect_cases(config: RunConfig) -> CaseSet:
    notes: list[str] = []
    if config.selected:
        from shardspec.fixtures import load_case, load_case_file

        from_files = {path: load_case_file(path) for path in config.case_files}
        cases = _unique_ids([load_case(case_id) for case_id in config.case_ids] + list(from_files.values()))
        files = {case.case_id: str(pathlib.Path(path).resolve()) for path, case in from_files.items()}
        return CaseSet(cases, set(), notes, files)
    cases = [c for c in _fixture_cases(notes) if c.tp_size in config.tp_sizes]
    generated: list[Case] = []
    if not config.fixtures_only and config.max_examples > 0:
        from shardspec.conformance.strategies import generate_cases

        for tp in config.tp_sizes:
            generated += generate_cases(tp, config.max_examples, config.seed)
    return CaseSet(_unique_ids(cases + generated), {c.case_id for c in generated}, notes)


def _fixture_cases(notes: list[str]) -> list[Case]:
    try:
        from shardspec.fixtures import load_cases
    except ImportError as exc:
        notes.append(f"no golden fixtures: shardspec.fixtures is not importable ({exc})")
        return []
    return load_cases()


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


def run_implementation(config: RunConfig, impl: str, case_set: CaseSet, run_dir: pathlib.Path,
                       log: Log, tp_sizes: Optional[list[int]] = None) -> list[CaseResult]:
    """The cases of ``tp_sizes`` (default: all) for one implementation choice, size by size."""
    choice = ImplChoice(impl, config.impl_odd)
    try:
        for name in filter(None, (choice.impl, choice.impl_odd)):
            load_implementation(name)
    except ImplementationError as exc:
        log(f"cannot run {choice.label}: {exc}")
        return [not_run(case, choice.label, str(exc)) for case in case_set.cases
                if tp_sizes is None or case.tp_size in tp_sizes]
    results: list[CaseResult] = []
    for tp in tp_sizes or tp_sizes_of(config, case_set.cases):
        cases = [c for c in case_set.cases if c.tp_size == tp]
        if cases:
            results += _run_group_size(config, choice, tp, cases, run_dir, log)
    _shrink_failures(config, choice, results, case_set.generated, run_dir, log)
    for result in results:
        result.generated = result.case_id in case_set.generated
        if not result.reproduce and result.case_id in case_set.files:
            result.reproduce = _command(choice, f"--case-file {case_set.files[result.case_id]}")
        result.reproduce = result.reproduce or reproduce_command(choice, result.case, result.generated, run_dir)
    return results


def _run_group_size(config, choice, tp, cases, run_dir, log) -> list[CaseResult]:
    start = time.perf_counter()

    def on_result(result: CaseResult) -> None:
        if config.verbose or result.status in (FAIL, ERROR):
            log(f"    {result.status:7s} {result.case_id} (tp {tp})")

    if config.in_process:
        from shardspec.conformance.inprocess import run_cases_in_process

        results = run_cases_in_process(cases, choice, config.pg_timeout_s, on_result)
    else:
        folder = run_dir / f"{_slug(choice.label)}-tp{tp}"
        options = LaunchOptions(folder, config.case_timeout_s, config.pg_timeout_s)
        results = run_cases_multiprocess(cases, choice, tp, options, on_result, log)
    counts = {s: sum(r.status == s for r in results) for s in ("pass", FAIL, ERROR, NOT_RUN)}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    log(f"  tp {tp}: {len(results)} case(s): {summary} ({time.perf_counter() - start:.1f}s)")
    return results


def _slug(label: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in label)[:60]


def _shrink_failures(config, choice, results, generated, run_dir, log) -> None:
    from shardspec.conformance.inprocess import run_case_in_process
    from shardspec.conformance.shrink import shrink, shrinkable, signature

    failing = [r for r in results if r.case_id in generated and r.status in (FAIL, ERROR)]
    done: set[frozenset] = set()  # one minimal case per kind of failure
    for result in failing:
        kind = frozenset(signature(result))
        if not config.shrink or len(done) >= config.max_shrinks or kind in done or not shrinkable(result):
            continue
        done.add(kind)
        log(f"  shrinking {result.case_id} in one process ...")
        try:
            smallest = shrink(result.case, result, lambda c: run_case_in_process(c, choice, timeout_s=10.0))
        except Exception as exc:  # the failure is still reported, unshrunk
            log(f"  could not shrink {result.case_id}: {exc}")
            continue
        path = write_case_file(smallest, run_dir)
        result.reproduce = reproduce_command(choice, smallest, True, run_dir)
        log(f"  minimal failing case ({path}):")
        log(textwrap.indent(path.read_text().rstrip(), "    | "))
        log(f"  reproduce: {result.reproduce}")


def write_case_file(case: Case, run_dir: pathlib.Path) -> pathlib.Path:
    from shardspec.fixtures import case_to_yaml

    folder = run_dir / "failing"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{case.case_id}.yaml"
    path.write_text(case_to_yaml(case))
    return path


def reproduce_command(choice: ImplChoice, case: Case, generated: bool, run_dir: pathlib.Path) -> str:
    if not generated:
        return _command(choice, f"--case {case.case_id}")
    path = run_dir / "failing" / f"{case.case_id}.yaml"
    if not path.exists():
        write_case_file(case, run_dir)
    return _command(choice, f"--case-file {path} --tp {case.tp_size}")


def _command(choice: ImplChoice, selection: str) -> str:
    return " ".join(["python -m shardspec.conformance", *choice.cli_args(), selection])


def make_run_dir(config: RunConfig) -> tuple[pathlib.Path, bool]:
    """The run directory, and whether it is a temporary one (removed after a clean run)."""
    if config.run_dir is not None:
        config.run_dir.mkdir(parents=True, exist_ok=True)
        return config.run_dir, False
    return pathlib.Path(tempfile.mkdtemp(prefix="shardspec-conformance-")), True


def remove_run_dir(path: pathlib.Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
