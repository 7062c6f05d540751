"""Multi-process runs: ``torchrun --nproc-per-node tp`` over many cases.

The parent computes the reference expectations once per case, saves them
with the cases into a run directory, and launches the group. Every rank
appends one JSON line per case; the parent follows those files while the
group runs, combines the ranks of each case, and relaunches after a launch
ends early (a rank raised, hung or died) for the cases not yet run.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.expectations import compute_expectation, rank_device_kind, save_expectations
from shardspec.conformance.results import CaseResult, combine, not_run
from shardspec.spec.case import Case

STARTUP_S = 90.0  # torch import and rendezvous, generous for 8 ranks on 2 cores


@dataclass
class LaunchOptions:
    run_dir: pathlib.Path
    case_timeout_s: float = 60.0
    pg_timeout_s: float = 60.0
    max_relaunches: int = 5
    poll_s: float = 0.3


def run_cases_multiprocess(cases: list[Case], choice: ImplChoice, tp: int, options: LaunchOptions,
                           on_result: Optional[Callable[[CaseResult], None]] = None,
                           log: Callable[[str], None] = print) -> list[CaseResult]:
    """Run ``cases`` (all of group size ``tp``); results in case order."""
    run_dir = options.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    device_kind = rank_device_kind(tp)
    expectations = {case.case_id: compute_expectation(case, options.pg_timeout_s, device_kind) for case in cases}
    save_expectations(run_dir / "expectations.pt", expectations)
    torch.save(cases, run_dir / "cases.pt")
    results: dict[int, CaseResult] = {}
    # Cases after which the reference itself leaves peers waiting in a
    # collective end a launch: run them last, so they cost fewer relaunches.
    breaking = {i for i, case in enumerate(cases) if _breaks_group(expectations[case.case_id])}
    remaining = [i for i in range(len(cases)) if i not in breaking] + sorted(breaking)
    for launch_number in range(options.max_relaunches + 1):
        if not remaining:
            break
        log(f"  launch {launch_number + 1}: tp {tp}, {len(remaining)} case(s), {choice.label}")
        outcome = _launch(cases, remaining, choice, tp, options, f"launch{launch_number}", results, on_result,
                          device_kind)
        remaining = [i for i in remaining if i not in results]
        if outcome is not None:  # the group never started: relaunching cannot help
            for index in remaining:
                results[index] = not_run(cases[index], choice.label, outcome)
            remaining = []
    for index in remaining:
        results[index] = not_run(cases[index], choice.label,
                                 f"not run: {options.max_relaunches} relaunches used up")
    return [results[i] for i in range(len(cases))]


def _breaks_group(expectation) -> bool:
    outs = expectation.expected
    if all(out.error is None for out in outs):
        return False
    return not all(out.error is not None and len(out.wire) == len(outs[0].wire) for out in outs)


def _launch(cases, indices, choice, tp, options, name, results, on_result, device_kind) -> Optional[str]:
    """One torchrun launch. Returns a reason when the group never became ready."""
    run_dir = options.run_dir
    spec = {"case_indices": indices, "impl": choice.impl, "impl_odd": choice.impl_odd, "device": device_kind,
            "case_timeout_s": options.case_timeout_s, "pg_timeout_s": options.pg_timeout_s}
    (run_dir / f"{name}.json").write_text(json.dumps(spec))
    log_path = run_dir / f"{name}.log"
    limit = STARTUP_S + len(indices) * (options.case_timeout_s + 5.0)
    follower = _Follower(run_dir, name, tp)
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(_torchrun_command(run_dir, name, tp), stdout=log_file,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=_worker_env(device_kind))
        ended = _follow(proc, limit, follower, cases, indices, choice, results, on_result, options.poll_s)
    follower.read()
    if not follower.ready:
        return f"the group did not start (exit {proc.returncode}); log {log_path}:\n{_tail(log_path)}"
    _settle_broken_case(cases, indices, choice, results, follower, ended, on_result)
    return None


def _torchrun_command(run_dir: pathlib.Path, name: str, tp: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={tp}",
            "-m", "shardspec.conformance.worker", str(run_dir), str(run_dir / f"{name}.json")]


def _worker_env(device_kind: str) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"  # the expectations are computed with one thread too
    if device_kind == "cpu":
        # Ranks on the CPU (no GPU, or fewer GPUs than ranks): Triton kernels
        # can only run in its interpreter there.
        env["TRITON_INTERPRET"] = "1"
    return env


def _follow(proc, limit, follower, cases, indices, choice, results, on_result, poll_s) -> str:
    """Combine cases as their records arrive; returns how the launch ended."""
    deadline = time.monotonic() + limit
    while True:
        exited = proc.poll() is not None
        follower.read()
        _take_complete(cases, indices, choice, results, follower, on_result)
        if exited:
            return f"the launch ended (exit {proc.returncode})"
        if all(i in results for i in indices):
            _let_finish(proc, grace_s=3.0)  # every record is in; shutdown adds nothing
            return "the launch finished"
        if time.monotonic() > deadline:
            _kill_group(proc)
            return f"the launch exceeded its {limit:.0f}s limit and was killed"
        time.sleep(poll_s)


def _take_complete(cases, indices, choice, results, follower, on_result) -> None:
    for index in indices:
        if index in results:
            continue
        case = cases[index]
        records = follower.records.get(case.case_id, {})
        if len(records) < case.tp_size:
            return  # cases finish in order: nothing later is complete either
        results[index] = combine(case, choice.label, records)
        if on_result:
            on_result(results[index])


def _settle_broken_case(cases, indices, choice, results, follower, ended, on_result) -> None:
    """The first unfinished case fails with what is known, unless a rank left on purpose before it."""
    for index in indices:
        if index in results:
            continue
        case = cases[index]
        records = follower.records.get(case.case_id, {})
        if records or not follower.left_on_purpose:
            results[index] = combine(case, choice.label, records, ended=ended)
            if on_result:
                on_result(results[index])
        return


def _let_finish(proc, grace_s: float) -> None:
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tail(path: pathlib.Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class _Follower:
    """Reads the ranks' JSONL files incrementally (lines may be half-written)."""

    def __init__(self, run_dir: pathlib.Path, name: str, tp: int):
        self.paths = [run_dir / f"{name}-rank{rank}.jsonl" for rank in range(tp)]
        self.offsets = [0] * tp
        self.records: dict[str, dict[int, dict[str, Any]]] = {}
        self.ready: set[int] = set()
        # A rank recorded why it left the launch (error, hang, suite failure).
        self.left_on_purpose = False

    def read(self) -> None:
        for rank, path in enumerate(self.paths):
            if not path.exists():
                continue
            with open(path, "rb") as f:
                f.seek(self.offsets[rank])
                chunk = f.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self.offsets[rank] += len(complete)
            for line in complete.splitlines():
                self._add(rank, line)

    def _add(self, rank: int, line: bytes) -> None:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            return
        if record.get("event") == "ready":
            self.ready.add(rank)
        elif "case_id" in record:
            self.records.setdefault(record["case_id"], {})[rank] = record
            if record.get("timeout") or record.get("harness_error") or not record.get("aligned", True):
                self.left_on_purpose = True
