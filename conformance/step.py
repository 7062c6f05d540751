"""One case on one rank: run the step, record everything, check it.

The step is the one an engine runs (:func:`shardspec.engine.engine_step`):
``shard_sampler_inputs``; the rank's vocab shard of the owner-sorted logits
rows; ``all_to_all_logits``; a local sampler on the implementation's own
full-vocab rows and local batch (the toy sampler, or the case's explicit
per-rank output); ``gather_sampler_output``.
An exception is recorded with its step and traceback instead of propagating.
"""

from __future__ import annotations

import contextlib
import functools
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shardspec.conformance.api import construction_kwargs
from shardspec.conformance.harness.held import HeldResults, shared_memory
from shardspec.conformance.harness.past_rejection import NotRejected, rejection_point
from shardspec.conformance.harness.recording import CollectiveError, Progress, RecordingComm, changed_fields, snapshot
from shardspec.conformance.judge.checks.base import RANK_CHECKERS, StepOutputs, StepRecord, Violation, checkers_for
from shardspec.conformance.judge.checks.common import declined_extensions
from shardspec.conformance.judge.digest import step_digest
from shardspec.engine import engine_step
from shardspec.reference.profile_rules import device_cu_num_logits
from shardspec.reference.sampler import toy_sample
from shardspec.spec.case import Case, CaseInputs, build_case_inputs, local_logits_shard
from shardspec.spec.case_edits import finish_local_output, gather_options
from shardspec.spec.layouts import lay_out_sampler_output

STEPS = ("shard", "all_to_all", "sample", "gather")


@dataclass
class RankRun:
    """What one rank did for one case (tensors included; not JSON-able)."""

    outputs: StepOutputs
    timings: dict[str, float] = field(default_factory=dict)
    # The error was raised inside a collective (possibly a peer's fault).
    error_in_collective: bool = False
    step: str = "construct"  # the step running now, or the last one
    on_step: StepCallback | None = None
    kept: KeptSharder | None = None  # the sharder, once constructed


@dataclass
class KeptSharder:
    """A sharder kept for the next step of a multi-step case, with the recorder it talks through and
    every earlier step's gathered result, held as an engine holds them (INV-GATHER-RESULT-STABLE)."""

    sharder: Any
    recorder: RecordingComm
    held: HeldResults = field(default_factory=HeldResults)


def local_sampler_output(case: Case, rank: int, full_vocab_logits, shard, device=None):
    """The local sampler's result for ``rank``: toy sampler or the case's explicit output (a rank the case
    does not list supplies None)."""
    device = full_vocab_logits.device if device is None else device
    if case.local_outputs == "toy":
        num_logprobs = None if case.logprobs_dims is None else case.logprobs_dims[0]
        logits = full_vocab_logits[:, : case.vocab_size]
        out = toy_sample(logits, shard.local_batch, shard.local_grammar_output, num_logprobs, case.profile)
    else:
        explicit = case.local_outputs.get(rank)
        out = None if explicit is None else explicit.to_sampler_output(device)
    # The case's extension fields and local-output edits (spec/case_edits.py), then its memory layout.
    out = finish_local_output(out, shard.local_batch, case.extensions, case.edits, device)
    return lay_out_sampler_output(out, case.layouts)


# What each step adds to the StepOutputs (the construct step adds nothing).
STEP_OUTPUT = {"shard": "shard", "all_to_all": "full_vocab_logits", "sample": "local_output", "gather": "gathered"}
StepCallback = Callable[[str, "RankRun"], None]


class CallLog(list):
    """The calls of a step; ``on_call`` sees each one as it is recorded, before it is issued, so a
    transcript holds the collective a rank was in when it died."""

    def __init__(self, on_call: Callable[[Any], None] | None = None):
        super().__init__()
        self.on_call = on_call

    def append(self, call) -> None:
        if self.on_call is not None:
            self.on_call(call)
        super().append(call)


def run_step(
    make_sharder,
    case: Case,
    inputs: CaseInputs,
    comm,
    device,
    progress: Progress | None = None,
    on_step: StepCallback | None = None,
    kept: KeptSharder | None = None,
    on_call: Callable[[Any], None] | None = None,
) -> RankRun:
    """Run the whole step for ``comm.rank``; never raises for the implementation's errors.

    ``on_step(step, run)`` is called after each step that returned, so a
    transcript can leave the rank before a later step crashes it. ``kept``:
    the sharder of this case's previous step (a multi-step case calls one
    sharder instance every step, as an engine does); None constructs one.
    """
    recorder = kept.recorder if kept is not None else RecordingComm(comm, progress)
    recorder.calls = CallLog(on_call)  # this step's collectives only
    run = RankRun(outputs=StepOutputs(wire=recorder.calls), kept=kept)
    run.on_step = on_step
    before = {"batch": snapshot(inputs.batch), "grammar": snapshot(inputs.grammar)}
    watched = {"batch": inputs.batch, "grammar": inputs.grammar}
    # Multi-process runs also record collectives issued on comm.group directly.
    intercept = recorder.intercept_torch_distributed() if recorder.group is not None else contextlib.nullcontext()
    try:
        with intercept:
            _steps(make_sharder, case, inputs, recorder, device, run, before, watched)
    except Exception as exc:  # recorded; the checkers and the report judge it
        out = run.outputs
        out.failed_step, out.error = run.step, exc
        out.error_traceback = traceback.format_exc()
        run.error_in_collective = isinstance(exc, CollectiveError)
    except NotRejected:  # the rank went on where it must raise: INV-REJECT-INVALID judges it
        pass
    finally:
        recorder.progress.enter(step=None)
    run.outputs.inputs_modified = [
        name for key, old in before.items() for name in changed_fields(key, old, watched[key])
    ]
    run.outputs.results_sharing_inputs = shared_memory("gathered", run.outputs.gathered, watched)
    if run.kept is not None:
        run.outputs.held_results_modified = run.kept.held.changed()
        run.kept.held.hold(case.case_id, run.outputs.gathered)
    return run


def _steps(make_sharder, case, inputs, recorder: RecordingComm, device, run: RankRun, before, watched) -> None:
    rank = recorder.rank
    if run.kept is None:
        sharder = _timed(
            run,
            recorder.progress,
            "construct",
            make_sharder,
            case.max_num_reqs,
            case.max_num_logits_per_req,
            comm=recorder,
            device=device,
            **construction_kwargs(make_sharder, case.profile, case.adaptive_verification),
        )
        run.kept = KeptSharder(sharder, recorder)
    timed = functools.partial(_timed, run, recorder.progress)

    def logits_shard_of(shard):
        # What the shard step returned is an input of the sampler and of the later operations.
        taken = {
            "local_batch": shard.local_batch,
            "local_grammar_output": shard.local_grammar_output,
            "metadata": shard.metadata,
        }
        before["shard"], watched["shard"] = snapshot(taken), taken
        logits_shard = local_logits_shard(inputs, shard.sorted_logits_indices, case, rank)
        before["logits_shard"], watched["logits_shard"] = snapshot(logits_shard), logits_shard
        return logits_shard

    def sample(full_vocab_logits, shard):
        local_output = local_sampler_output(case, rank, full_vocab_logits, shard, device)
        before["local_output"], watched["local_output"] = snapshot(local_output), local_output
        return local_output

    gather_kwargs = {
        "gather_num_nans": case.gather_num_nans,
        "logprobs_dims": case.logprobs_dims,
        **gather_options(case.extensions),
    }
    engine_step(run.kept.sharder, inputs.batch, inputs.grammar, logits_shard_of, sample, gather_kwargs, timed)


def _timed(run: RankRun, progress: Progress, step: str, fn, *args, **kwargs):
    run.step = step
    progress.enter(step=step)
    start = time.perf_counter()
    try:
        result = fn(*args, **kwargs)
    finally:
        run.timings[step] = time.perf_counter() - start
    if step in STEP_OUTPUT:
        setattr(run.outputs, STEP_OUTPUT[step], result)
    if run.on_step is not None:
        run.on_step(step, run)
    return result


def should_check(case: Case, outputs: StepOutputs) -> bool:
    """Checkers judge complete steps, expected rejections and declined extension fields; other errors
    fail the case as errors."""
    return outputs.error is None or case.expect_error is not None or declined_extensions(case, outputs)


def run_rank_checks(record: StepRecord) -> list[Violation]:
    violations: list[Violation] = []
    for invariant_id, checker in checkers_for(RANK_CHECKERS, record.case.profile).items():
        violations.extend(_guarded(invariant_id, record.rank, functools.partial(checker, record)))
    return violations


def judged_invariants(record: StepRecord) -> list[str]:
    """The rank checkers that could judge ``record`` (the others have nothing to look at in it)."""
    from shardspec.conformance.judge.checks.base import judgeable

    checkers = checkers_for(RANK_CHECKERS, record.case.profile)
    return [invariant_id for invariant_id in checkers if judgeable(invariant_id, record)]


def _guarded(invariant_id: str, rank: int | None, call) -> list[Violation]:
    """Run a checker; a checker that crashes reports a violation instead of ending the run."""
    try:
        return list(call() or ())
    except Exception as exc:
        where = traceback.format_exc(limit=-2)
        return [Violation(invariant_id, f"checker raised {type(exc).__name__}: {exc}\n{where}", rank=rank)]


def run_group_checks(case: Case, digests: dict[int, dict[str, Any]]) -> list[Violation]:
    from shardspec.conformance.judge.checks.base import GROUP_CHECKERS

    violations: list[Violation] = []
    for invariant_id, checker in checkers_for(GROUP_CHECKERS, case.profile).items():
        violations.extend(_guarded(invariant_id, None, functools.partial(checker, case, digests)))
    return violations


def error_summary(run: RankRun) -> dict[str, Any] | None:
    out = run.outputs
    if out.error is None:
        return None
    return {
        "step": out.failed_step,
        "type": type(out.error).__name__,
        "message": str(out.error),
        "traceback": out.error_traceback,
        "in_collective": run.error_in_collective,
        "precondition_id": getattr(out.error, "precondition_id", None),
    }


def continue_after(case: Case, run: RankRun, expected: list[StepOutputs]) -> bool:
    """Whether the group's collectives can still be aligned after this rank's step.

    True when the step completed, or when the error is an expected rejection
    raised outside a collective at the point where the reference rejects on
    every rank alike (replicated inputs). Otherwise peers may wait in a
    collective this rank will never enter.
    """
    out = run.outputs
    if out.error is None:
        return True
    if run.error_in_collective:
        return False
    if declined_extensions(case, out):
        return True  # the declaration is replicated: every rank declines at the same point
    if case.expect_error is None:
        return False
    return all(ref.error is not None and len(ref.wire) == len(out.wire) for ref in expected)


def run_case_on_rank(
    case: Case,
    comm,
    impl_name: str,
    make_sharder,
    expectation,
    device,
    progress: Progress | None = None,
    on_step: StepCallback | None = None,
    kept: KeptSharder | None = None,
    on_call: Callable[[Any], None] | None = None,
) -> tuple[dict[str, Any], KeptSharder | None]:
    """Run ``case`` on ``comm.rank``, unjudged: the record carries the raw ``outputs``; and the sharder,
    kept for a next step of the same case.

    The expectation only decides whether the group can go on after an error
    (the reference's collectives); judging is :func:`judge_rank`'s.
    """
    rank = comm.rank
    inputs = build_case_inputs(case, device)
    stop = rejection_point(case, expectation.expected[rank])  # stops the rank where it must raise
    run = run_step(make_sharder, case, inputs, comm, device, progress, stop.steps(on_step), kept, stop.calls(on_call))
    run.outputs.not_rejected = stop.stopped
    expected_to_raise = case.expect_error is not None or declined_extensions(case, run.outputs)
    return {
        "case_id": case.case_id,
        "rank": rank,
        "impl": impl_name,
        "error": None if expected_to_raise else error_summary(run),
        "rejection": error_summary(run) if expected_to_raise else None,
        "timings": {k: round(v, 6) for k, v in run.timings.items()},
        "error_in_collective": run.error_in_collective,
        "aligned": continue_after(case, run, expectation.expected),
        "outputs": run.outputs,
    }, run.kept


def judge_rank(
    case: Case, record: dict[str, Any], expectation, inputs: CaseInputs, completed: set[str] | None = None
) -> dict[str, Any]:
    """``record`` with its ``outputs`` judged: ``violations`` and the group checkers' ``digest`` instead.

    ``completed``: the steps a rank that died mid-step finished; only
    invariants of those steps are judged then (the rest cannot be).
    """
    record = dict(record)
    outputs: StepOutputs = record.pop("outputs")
    rank = record["rank"]
    start = time.perf_counter()
    violations: list[Violation] = []
    judged: list[str] = []
    if completed is not None:
        violations = _judge_partial(case, rank, outputs, expectation, inputs, completed)
    elif should_check(case, outputs):
        step_record = StepRecord(
            case=case,
            rank=rank,
            inputs=inputs,
            actual=outputs,
            expected=expectation.expected[rank],
            replicated=expectation.replicated,
        )
        violations = run_rank_checks(step_record)
        judged = judged_invariants(step_record)
    elif outputs.error is not None:  # judge what the steps before the error returned
        violations = _judge_partial(case, rank, outputs, expectation, inputs, returned_steps(outputs))
    record["judged"] = judged
    record["timings"] = {**record.get("timings", {}), "checks": round(time.perf_counter() - start, 6)}
    record["violations"] = [violation_dict(v) for v in violations]
    record["digest"] = step_digest(
        outputs,
        rank=rank,
        impl=record["impl"],
        error_in_collective=record.get("error_in_collective", False),
        logprob_rows=int(device_cu_num_logits(inputs.batch, case.profile)[-1]),
    )
    return record


def _judge_partial(case, rank, outputs, expectation, inputs, completed: set[str]) -> list[Violation]:
    """The invariants of the steps a dead rank completed; a checker that needs more is not judged."""
    steps = invariant_steps()
    record = StepRecord(
        case=case,
        rank=rank,
        inputs=inputs,
        actual=outputs,
        expected=expectation.expected[rank],
        replicated=expectation.replicated,
    )
    violations = []
    for invariant_id, checker in checkers_for(RANK_CHECKERS, case.profile).items():
        if steps.get(invariant_id) not in completed:
            continue
        try:
            violations.extend(checker(record) or ())
        except Exception:  # needs outputs of a step the rank never finished
            continue
    return violations


def returned_steps(outputs: StepOutputs) -> set[str]:
    """The steps whose results ``outputs`` holds."""
    held = {"shard": outputs.shard, "all_to_all": outputs.full_vocab_logits, "gather": outputs.gathered}
    return {step for step, value in held.items() if value is not None}


@functools.lru_cache(maxsize=1)
def invariant_steps() -> dict[str, str]:
    from shardspec.spec.loader import load_spec

    return {inv.id: inv.step for inv in load_spec().invariants}


def check_case_on_rank(
    case: Case,
    comm,
    impl_name: str,
    make_sharder,
    expectation,
    device,
    progress: Progress | None = None,
    kept: KeptSharder | None = None,
) -> tuple[dict[str, Any], KeptSharder | None]:
    """Run ``case`` on ``comm.rank`` and judge it in this process (the in-process groups)."""
    record, kept = run_case_on_rank(case, comm, impl_name, make_sharder, expectation, device, progress, kept=kept)
    return judge_rank(case, record, expectation, build_case_inputs(case, device)), kept


def violation_dict(v: Violation) -> dict[str, Any]:
    return {
        "invariant_id": v.invariant_id,
        "message": v.message,
        "rank": v.rank,
        "request": v.request,
        "field": v.field,
    }
