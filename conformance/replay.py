"""Cases run in this process with the suite's judge: fixture replay, shrinking, and tests of the checkers.

The harness runs ranks and the judge judges; this module hands the one to
the other for runs without a session (:func:`run_case_in_process`), runs the
shrinker in a child process (:func:`shrink_in_child`: a crash there loses
the minimal case, not the run), and gives tests of the checkers what the
checkers see (:func:`step_records`).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import shardspec.conformance.judge.checks  # noqa: F401  registers every checker
from shardspec.comm import LockstepGroup
from shardspec.conformance.api import ImplChoice
from shardspec.conformance.cases.shrink import Shrunk, shrink_keeping
from shardspec.conformance.harness import inprocess
from shardspec.conformance.harness.expectations import (
    compute_expectation,
    contradiction,
    expectation_device,
    interpret_triton_without_gpu,
)
from shardspec.conformance.harness.rank_step import run_step
from shardspec.conformance.harness.spawn import describe_exit
from shardspec.conformance.judge.checks.base import StepRecord
from shardspec.conformance.judge.verdicts import Judge
from shardspec.conformance.record import ERROR, CaseResult
from shardspec.fixtures import case_to_yaml, load_case_file
from shardspec.fixtures.catalogue import with_profile
from shardspec.spec.case import Case, build_case_inputs
from shardspec.spec.rules import Rules


def suite_judge(timeout_s: float = 60.0) -> Judge:
    """The judge of a run: the reference's expectations computed (once per case and device) with
    ``timeout_s`` for its own group."""
    return Judge(lambda case, device: compute_expectation(case, timeout_s, device))


def run_case_in_process(
    case: Case, choice: ImplChoice, timeout_s: float = 60.0, group: str = "lockstep", device: str = "auto"
) -> CaseResult:
    """One case (every step of a multi-step one) run by ``choice`` with every rank a thread of this process."""
    return inprocess.run_case_in_process(case, choice, suite_judge(timeout_s), timeout_s, group, device)


def step_records(case: Case, factory, device: str | None = None) -> list:
    """Every rank of a one-step ``case`` run by ``factory`` in one lockstep group, as the checkers see it
    (a :class:`~shardspec.conformance.judge.checks.base.StepRecord` per rank, with the reference's
    expectation), unjudged: for tests of the checkers."""
    device = device or expectation_device()  # ranks run where the expectation was computed
    expectation = compute_expectation(case, device=device)

    def one_rank(comm):
        inputs = build_case_inputs(case, device)
        return StepRecord(
            case=case,
            rank=comm.rank,
            inputs=inputs,
            actual=run_step(factory, case, inputs, comm, device).outputs,
            expected=expectation.expected[comm.rank],
            replicated=expectation.replicated,
        )

    return LockstepGroup(case.tp_size, timeout_s=30).run(one_rank)


def shrink_in_child(
    case: Case, target: set[str], entry: str, group: str, device: str, folder: pathlib.Path, budget_s: float = 30.0
) -> Shrunk:
    """:func:`shrink_keeping` in a child process running ``entry`` in-process; raises RuntimeError when it fails."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "in").mkdir(parents=True, exist_ok=True)  # case files are named by their case id
    source, result = folder / "in" / f"{case.case_id}.yaml", folder / f"{case.case_id}-min.yaml"
    source.write_text(case_to_yaml(case))
    result.unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        __name__,
        str(source),
        entry,
        group,
        device,
        json.dumps(sorted(target)),
        str(result),
        str(budget_s),
        case.rules.profile,
        json.dumps(case.rules.as_dict()),  # the case's rules as resolved here: the child looks up no profile
    ]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=budget_s + 60, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"the shrinking process did not finish within {budget_s + 60:.0f}s") from exc
    finally:
        source.unlink(missing_ok=True)
    if proc.returncode != 0 or not result.exists():
        tail = "\n".join(proc.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"the shrinking process {describe_exit(proc.returncode)}: {tail}")
    found = json.loads(_facts(result).read_text())
    outcome = Shrunk(with_profile(load_case_file(str(result)), case.rules), found["simplifications"], found["tried"])
    outcome.replayed = None if found["replayed"] is None else frozenset(found["replayed"])
    outcome.others = {frozenset(ids): n for ids, n in found["others"]}
    result.unlink()
    _facts(result).unlink()
    return outcome


def agreeing(run, device: str = "auto"):
    """``run`` for the shrinker, but for a variant the reference contradicts (harness/expectations.py,
    contradiction): its result fails nothing of a target, so no such variant is kept, and a reproduce
    command never names a case file that ``--case-file`` refuses."""

    def run_agreeing(case):
        problem = contradiction(case, 10.0, expectation_device(device))
        if problem is None:
            return run(case)
        return CaseResult(case, "", ERROR, errors=[{"rank": None, "kind": "harness", "message": problem}])

    return run_agreeing


def _facts(case_file: pathlib.Path) -> pathlib.Path:
    """Where the child writes what the shrink found besides the case."""
    return case_file.with_suffix(".json")


def main(argv: list[str]) -> int:
    """``python -m shardspec.conformance.replay CASE_FILE ENTRY GROUP DEVICE TARGET_JSON OUT_FILE BUDGET_S
    PROFILE RULES_JSON``."""
    interpret_triton_without_gpu()  # before the implementation is imported
    source, entry, group, device, target, out, budget, profile, rules = argv
    choice = ImplChoice.parse(entry)
    outcome = shrink_keeping(
        with_profile(load_case_file(source), Rules.of(profile, json.loads(rules))),
        set(json.loads(target)),
        agreeing(lambda c: run_case_in_process(c, choice, timeout_s=10.0, group=group, device=device), device),
        float(budget),
    )
    facts = {
        "simplifications": outcome.simplifications,
        "tried": outcome.tried,
        "replayed": None if outcome.replayed is None else sorted(outcome.replayed),
        "others": [[sorted(ids), n] for ids, n in outcome.others.items()],
    }
    _facts(pathlib.Path(out)).write_text(json.dumps(facts))
    pathlib.Path(out).write_text(case_to_yaml(outcome.case))  # last: the parent waits for this file
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
