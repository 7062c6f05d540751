"""A whole conformance run: run the cases of each group size, judge, shrink the failures; and the group the
run's configuration asks for."""

from __future__ import annotations

import pathlib
import shutil
import tempfile
import textwrap
import time

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.cases.shrink import shrinkable, signature
from shardspec.conformance.harness.group import Group, Job
from shardspec.conformance.harness.inprocess import ThreadGroup
from shardspec.conformance.harness.multiprocess import ProcessGroup
from shardspec.conformance.record import ERROR, FAIL, NOT_RUN, CaseResult, not_run
from shardspec.conformance.replay import shrink_in_child, suite_judge
from shardspec.conformance.run.collect import cases_of_entry
from shardspec.conformance.run.config import CaseSet, Log, RunConfig
from shardspec.conformance.run.reproduce import (
    annotate,
    mode_args,
    prepare_reproduction,
    reproduce_command,
    write_case_file,
)


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

    results = group.run(jobs, tp, suite_judge(config.pg_timeout_s), on_result)
    for label in dict.fromkeys(job.choice.label for job in jobs):
        mine = [r for r in results if r.impl == label]
        counts = {s: sum(r.status == s for r in mine) for s in ("pass", FAIL, ERROR, NOT_RUN)}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        log(f"  tp {tp}, {label}: {len(mine)} case(s): {summary}")
    log(f"  tp {tp}: {len(results)} job(s) in {time.perf_counter() - start:.1f}s")
    return results


def _shrink_failures(config, choice, results, generated, run_dir, log) -> None:
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


def group_for(config: RunConfig, run_dir: pathlib.Path, log: Log) -> Group:
    """The group a run's configuration (:class:`~shardspec.conformance.run.config.RunConfig`) asks for."""
    if config.in_process:
        return ThreadGroup(
            config.in_process_group, config.in_process_device, config.pg_timeout_s, max_crashes=config.max_crashes
        )
    return ProcessGroup(
        run_dir,
        config.case_timeout_s,
        config.pg_timeout_s,
        config.launcher,
        log,
        max_crashes=config.max_crashes,
        tp_groups=config.tp_groups,
        share_gpus=config.share_gpus,
    )
