"""A conformance session: run implementations, then report once.

Shared by the command line (one call runs everything) and the pytest entry
(one test per implementation and group size, one report at the end).
"""

from __future__ import annotations

import json
import signal
import time

import torch

import shardspec.conformance.judge.checks  # noqa: F401  registers every checker
from shardspec.conformance.api import ImplChoice
from shardspec.conformance.harness.expectations import expectation_device, interpret_triton_without_gpu
from shardspec.conformance.judge.checks import base as checks
from shardspec.conformance.output_paths import ReportPathError, release_run_dir, write_report
from shardspec.conformance.record import NOT_RUN, PASS, CaseResult, not_run
from shardspec.conformance.report import contract
from shardspec.conformance.report import summary as report
from shardspec.conformance.report.input_coverage import input_coverage, left_out_lines, summary_lines
from shardspec.conformance.report.xfails import Xfails, load_xfails
from shardspec.conformance.run.collect import cases_of_entry, collect_cases, tp_sizes_of
from shardspec.conformance.run.config import CaseSet, Log, RunConfig
from shardspec.conformance.run.reproduce import annotate, prepare_reproduction
from shardspec.conformance.run.runner import group_for, make_run_dir, remove_run_dir, run_group_size
from shardspec.spec.loader import spec_version
from shardspec.spec.profiles import profile_source


class ConformanceSession:
    def __init__(self, config: RunConfig, log: Log = print, case_set: CaseSet | None = None):
        """``case_set``: the cases, where the caller loaded them already (the named ones, when the options
        were checked); else they are collected here."""
        interpret_triton_without_gpu()  # before an implementation is imported
        self.config = config
        self.log = log
        self.start = time.perf_counter()
        self.run_dir, self.temporary_dir = make_run_dir(config)
        self.case_set = case_set if case_set is not None else collect_cases(config)
        for note in self.case_set.notes:
            log(f"note: {note}")
        self.tp_sizes = tp_sizes_of(config, self.case_set.cases)
        prepare_reproduction(self.case_set, self.run_dir)  # before any case runs: an interruption keeps them
        self.group = group_for(config, self.run_dir, log)  # where the ranks run; closed by finish()
        self.results: dict[str, list[CaseResult]] = {impl: [] for impl in config.impls}
        self.sizes_run: set[int] = set()
        self.invariants = report.load_invariants(config.profile)
        self._load_problems: dict[str, str | None] | None = None
        self.version_warnings: list[str] = []  # implementations that target another spec version
        self.releases: dict[str, str] = {}  # implementation name -> the release it says it is (RELEASE)

    def label(self, impl: str) -> str:
        return ImplChoice.parse(impl).label

    def case_counts(self, impl: str) -> dict[int, int]:
        """Cases per group size of one entry (0 where the entry does not apply)."""
        choice = ImplChoice.parse(impl)
        return {tp: len(cases_of_entry(self.config, choice, self.case_set, tp)) for tp in self.tp_sizes}

    def not_applicable(self, impl: str) -> dict[int, str]:
        choice = ImplChoice.parse(impl)
        return {tp: "a mixed group needs an odd rank" for tp in self.tp_sizes if not choice.applies_to(tp)}

    def header(self) -> str:
        lines = [
            f"shardspec conformance against spec {spec_version()}, profile {self._profile()}: implementation(s): "
            f"{', '.join(self.label(i) for i in self.config.impls)}",
            f"  mode: {self.group.describe()}; seed {self.config.seed}; run dir {self.run_dir}",
        ]
        for impl in self.config.impls:
            counts = self.case_counts(impl)
            cells = ", ".join(f"tp {tp}: {'n/a' if tp in self.not_applicable(impl) else n}" for tp, n in counts.items())
            lines.append(f"  {self.label(impl)}: cases per tp: {cells}")
        if any(ImplChoice.parse(i).mixed for i in self.config.impls) and not self.config.selected:
            lines.append(
                f"  mixed entries (A/B: even ranks A, odd ranks B) run the fixtures but those of "
                f"undefined behaviour, and {self.config.mixed_max_examples} generated case(s) per tp "
                f"(others {self.config.max_examples}); tp 1 is not applicable to them"
            )
        return "\n".join(lines)

    def run(self, impl: str, tp_sizes: list[int] | None = None) -> list[CaseResult]:
        """The results of entry ``impl`` at ``tp_sizes`` (default: all); every entry runs
        at a group size the first time any of them is asked for it."""
        sizes = tp_sizes or self.tp_sizes
        for tp in sizes:
            self.run_size(tp)
        return [r for r in self.results[impl] if r.tp in sizes]

    def run_size(self, tp: int) -> None:
        if tp in self.sizes_run:
            return
        self.sizes_run.add(tp)
        self.log(f"== tp {tp}: {', '.join(self.label(i) for i in self.config.impls)}")
        run_group_size(
            self.config,
            self.config.impls,
            self.case_set,
            self.run_dir,
            self.log,
            tp,
            self.load_problems(),
            self.results,
            self.group,
        )

    def load_problems(self) -> dict[str, str | None]:
        """Why each implementation cannot be loaded, asked once of a child process (this one judges)."""
        if self._load_problems is None:
            names = [name for impl in self.config.impls for name in ImplChoice.parse(impl).names()]
            self._load_problems = self.group.probe(names, self.config.rules, self.version_warnings, self.releases)
            for warning in self.version_warnings:
                self.log(f"warning: {warning}")
        return self._load_problems

    def run_all(self) -> None:
        self.log(self.header())
        for tp in self.tp_sizes:
            self.run_size(tp)

    def judged_results(self, impl: str) -> list[CaseResult]:
        """The results of ``impl`` that are verdicts: not those of cases outside the contract (a robustness
        run's findings, report/contract.py)."""
        return [r for r in self.results[impl] if not r.outside]

    def sections(self) -> list[report.Section]:
        sections = []
        for impl in self.results:
            results = self.judged_results(impl)
            if not results:
                continue
            na = self.not_applicable(impl)
            sizes = [tp for tp in self.tp_sizes if tp not in na]
            drawn = input_coverage(results, sizes, self.config.rules)
            sections.append(
                report.Section(self.label(impl), sorted(results, key=lambda r: r.tp), self.tp_sizes, na, drawn)
            )
        return sections

    def render(
        self, xfails: Xfails, sections: list[report.Section]
    ) -> tuple[str, list[list[list[str]]], list[str], int]:
        """The text report of ``sections``, the tables, warnings and the exit code."""
        checked = self.checked()
        levels = {inv.id: inv.level for inv in self.invariants}
        extra = sorted(checked - set(levels))
        invariants = self.invariants + [report.InvariantInfo(i, "MUST") for i in extra]
        parts, tables, failed = [], [], False
        for section in sections:
            rows = report.table_rows(section, invariants, checked, xfails)
            tables.append(rows)
            parts.append(f"\n== {section.label}\n{report.render_table(section, rows)}")
            failures = report.describe_failures(section, levels, xfails)
            if failures:
                parts.append("\nfailures:\n" + "\n".join(failures))
            failed |= bool(report.failing_invariants(rows))
        parts += ["", *(line for section in sections for line in summary_lines(section.label, section.input_coverage))]
        parts += left_out_lines(section.input_coverage for section in sections)
        parts += contract.outside_lines(self.case_set.outside, self.config.profile, self.config.robustness)
        parts += contract.robustness_lines(self.results)
        known_cases = {r.case_id for rs in self.results.values() for r in rs}
        warnings = xfails.warnings(set(levels) | checked, known_cases) + list(self.version_warnings)
        if not checked:
            warnings.append("no checker is registered: every invariant is not-run")
        parts += [f"warning: {w}" for w in warnings]
        return "\n".join(parts), tables, warnings, int(failed)

    def checked(self) -> set[str]:
        """The invariants a checker judges under the run's profile."""
        rules = self.config.rules
        registered = (checks.RANK_CHECKERS, checks.GROUP_CHECKERS)  # read now: a test may replace the registries
        return {invariant for registry in registered for invariant in checks.checkers_for(registry, rules)}

    def judged_rows(self) -> list[str]:
        """The rows of the table: every invariant, then the run-errors and not-run rows."""
        return [inv.id for inv in self.invariants] + [report.ERRORS_ROW, report.NOT_RUN_ROW]

    def verdict(self, impl: str, tp: int, row: str) -> tuple[str, str]:
        """One cell of the table and what explains it (the failures, or why nothing was judged)."""
        xfails = load_xfails(self.config.xfails_file)
        section = report.Section(
            self.label(impl), [r for r in self.judged_results(impl) if r.tp == tp], [tp], self.not_applicable(impl)
        )
        levels = {inv.id: inv.level for inv in self.invariants}
        rows = report.table_rows(section, self.invariants, self.checked(), xfails)
        cell = next(r[2] for r in rows if r[0] == row)
        if cell == report.NOT_APPLICABLE:
            return cell, self.not_applicable(impl).get(tp, "no case at this size could judge it")
        lines = report.describe_failures(section, levels, xfails)
        mine = [line for line in lines if f"[{row}]" in line or (row == report.ERRORS_ROW and line.startswith("ERROR"))]
        return cell, "\n".join(mine or lines)

    def finish(self, log: Log | None = None, interrupted: str | None = None, suite_errors: int = 0) -> int:
        """Print the report, write the JSON; the exit code (never 0 when no case was judged, nor when
        ``suite_errors`` tests of the suite failed outside the table: an error of the suite's own)."""
        self.group.close()
        release_run_dir(self.run_dir)  # the ranks are gone: the folder's lock is given up
        if interrupted:  # the cases the interruption left out are not run, and the report says so
            self._mark_unrun(f"the run was interrupted by {interrupted} before this case ran")
        xfails = load_xfails(self.config.xfails_file)
        sections = self.sections()  # built once: each computes its input coverage
        text, tables, warnings, exit_code = self.render(xfails, sections)
        log = log or self.log
        for line in text.splitlines():
            log(line)
        failures = list(getattr(self.group, "launch_failures", ()))
        for line in report.describe_launch_failures(failures):
            log(line)
        judged = sum(r.status != NOT_RUN for impl in self.results for r in self.judged_results(impl))
        if judged == 0:
            why = f" ({len(failures)} launch(es) did not run: see above)" if failures else ""
            warnings.append(f"no case was judged: the run proves nothing{why}")
            log(f"error: no case was judged: the run proves nothing{why}")
            exit_code = 1
        if suite_errors and exit_code == 0:
            # A test failed though no cell did: the suite itself raised (a fixture, the expectations), so the
            # table holds only what ran before it and is no verdict.
            warnings.append(f"{suite_errors} test(s) of the suite failed outside the table: the run proves nothing")
            log(f"error: {suite_errors} test(s) of the suite failed outside the table (above): the run proves nothing")
            exit_code = 1
        if interrupted:
            warnings.append(f"interrupted by {interrupted}: partial report")
            exit_code = _exit_status_of(interrupted)
        wall = time.perf_counter() - self.start
        if self.config.json_path:
            metadata = report.run_metadata(
                [s.label for s in sections],
                self.tp_sizes,
                self.config.seed,
                wall,
                *self._backend(),
                self._extra(),
            )
            data = report.json_report(
                metadata, sections, tables, warnings, exit_code, self.invariants, failures, xfails
            )
            tp_of = {case.case_id: case.tp_size for case in self.case_set.cases}
            data.update(contract.json_part(self.case_set.outside, tp_of, self.results))
            try:
                write_report(self.config.json_path, json.dumps(data, indent=1, default=repr))
                log(f"JSON report: {self.config.json_path}")
            except (ReportPathError, OSError) as exc:  # the path changed since the run started, or the disk is full
                log(f"error: the JSON report was not written: --json {self.config.json_path}: {exc}")
                exit_code = exit_code or 1
        log(f"{'FAILED' if exit_code else 'PASSED'} in {wall:.1f}s")
        everything_passed = all(r.status == PASS for results in self.results.values() for r in results)
        if exit_code == 0 and self.temporary_dir and everything_passed:
            remove_run_dir(self.run_dir)  # else reproduce commands (warnings, xfails) point into it
        return exit_code

    def _mark_unrun(self, reason: str) -> None:
        for impl in self.config.impls:
            choice = ImplChoice.parse(impl)
            for tp in self.tp_sizes:
                done = {r.case_id for r in self.results[impl] if r.tp == tp}
                for case in cases_of_entry(self.config, choice, self.case_set, tp):
                    if case.case_id not in done:
                        result = not_run(case, choice.label, reason)
                        self.results[impl].append(annotate(self.config, choice, result, self.case_set, self.run_dir))

    def _backend(self) -> tuple[str, str]:
        if self.config.in_process:
            device = expectation_device(self.config.in_process_device)
            return (
                f"{self.config.in_process_group} group (ranks as threads)",
                torch.cuda.get_device_name(0) if device == "cuda" else device,
            )
        if torch.cuda.is_available():
            gpus = torch.cuda.device_count()
            return (f"nccl where tp <= {gpus} GPUs, else gloo on the CPU", f"{gpus} x {torch.cuda.get_device_name(0)}")
        return "gloo", "cpu"

    def _profile(self) -> str:
        source = profile_source(self.config.profile)
        return self.config.profile + (f" (file {source['path']}, sha256 {source['sha256']})" if source else "")

    def _extra(self) -> dict:
        return {
            "profile": self.config.profile,
            "profile_file": profile_source(self.config.profile),  # the path and hash of a user's file
            "mode": f"in-process ({self.config.in_process_group})" if self.config.in_process else "multi-process",
            "cases": len(self.case_set.cases),
            "max_examples": self.config.max_examples,
            "robustness": self.config.robustness,
            "mixed_max_examples": self.config.mixed_max_examples,
            "cases_per_tp": {self.label(i): self.case_counts(i) for i in self.config.impls},
            "run_dir": str(self.run_dir),
            # What the case selection noted (e.g. a group size the profile builds no sharder for).
            "notes": list(self.case_set.notes),
            # What each implementation says it is (its factory's RELEASE), for a page of releases.
            "releases": dict(self.releases),
        }


def report_unstarted(config: RunConfig, interrupted: str, log: Log = print) -> int:
    """A run ended by ``interrupted`` (a signal's name) before its first case: the report of a run that judged
    nothing, with its reason, in the terminal and the JSON; the exit status."""
    exit_code = _exit_status_of(interrupted)
    why = f"interrupted by {interrupted} before any case was judged (while the run's cases were being made)"
    log(f"error: {why}: the run proves nothing")
    if config.json_path:
        labels = [ImplChoice.parse(impl).label for impl in config.impls]
        extra = {"profile": config.profile, "run_dir": str(config.run_dir)}
        metadata = report.run_metadata(labels, config.tp_sizes, config.seed, 0.0, "not started", "none", extra)
        invariants = report.load_invariants(config.profile)
        data = report.json_report(metadata, [], [], [why, "partial report"], exit_code, invariants)
        try:
            write_report(config.json_path, json.dumps(data, indent=1, default=repr))
            log(f"JSON report: {config.json_path}")
        except (ReportPathError, OSError) as exc:
            log(f"error: the JSON report was not written: --json {config.json_path}: {exc}")
    log(f"FAILED ({why})")
    return exit_code


def _exit_status_of(signal_name: str) -> int:
    """The status a process ended by ``signal_name`` reports, 128 + its number (the plugin exits with it)."""
    try:
        return 128 + signal.Signals[signal_name].value
    except KeyError:
        return 1
