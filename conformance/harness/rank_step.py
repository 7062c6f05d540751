"""One case on one rank, run and recorded, unjudged: what the rank hands the judge.

The step is the one an engine runs (:func:`shardspec.engine.engine_step`):
``shard_sampler_inputs``; the rank's vocab shard of the owner-sorted logits
rows; ``all_to_all_logits``; a local sampler on the implementation's own
full-vocab rows and local batch (:mod:`shardspec.reference.local_sampler`);
``gather_sampler_output``. An exception is recorded with its step and
traceback instead of propagating; judging is the judge's
(:mod:`shardspec.conformance.judge.rank`).
"""

from __future__ import annotations

import contextlib
import functools
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from shardspec.conformance.api import construction_kwargs
from shardspec.conformance.harness.after_step import AfterStep
from shardspec.conformance.harness.held import HeldResults, shared_memory
from shardspec.conformance.harness.past_rejection import NotRejected
from shardspec.conformance.harness.patching import DIRECT_CALLS, STARTED_THREADS
from shardspec.conformance.harness.progress import Progress
from shardspec.conformance.harness.rank_plan import RankPlan
from shardspec.conformance.harness.recording import CollectiveError, RecordingComm
from shardspec.conformance.harness.snapshots import changed_fields, snapshot
from shardspec.conformance.record import STEP_OUTPUT, StepOutputs
from shardspec.engine import engine_step
from shardspec.reference.local_sampler import local_sampler_output
from shardspec.spec.case import Case, CaseInputs, build_case_inputs, local_logits_shard
from shardspec.spec.case_edits import gather_kwargs
from shardspec.spec.errors import declines_extensions


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
    # The second look at the step's inputs and result, where the caller defers it (see run_step).
    after: AfterStep | None = None
    # Whether to copy the gathered result as the gather returns it (for the second look), and the copy.
    copy_result: bool = False
    returned: Any = None
    # Counts the collectives the process performed (harness/performed.py), and its count once constructed.
    counter: Callable[[], int | None] | None = None
    performed_from: int | None = None


@dataclass
class KeptSharder:
    """A sharder kept for the next step of a multi-step case, with the recorder it talks through and
    every earlier step's gathered result, held as an engine holds them (INV-GATHER-RESULT-STABLE)."""

    sharder: Any
    recorder: RecordingComm
    held: HeldResults = field(default_factory=HeldResults)


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
    defer_after: bool = False,
    counter: Callable[[], int | None] | None = None,
) -> RankRun:
    """Run the whole step for ``comm.rank``; never raises for the implementation's errors.

    ``on_step(step, run)`` is called after each step that returned, so a
    transcript can leave the rank before a later step crashes it. ``kept``:
    the sharder of this case's previous step (a multi-step case calls one
    sharder instance every step, as an engine does); None constructs one.

    Every thread the step starts records to the same recorder until the
    step's results are handed back, and the inputs and the gathered result
    are compared once more then (:class:`AfterStep`): at the end of this
    call, after waiting for the threads the step left running, or, with
    ``defer_after``, when the caller calls ``run.after.finish(run.outputs)``
    (a multi-process rank: once its peers have finished the step too).

    ``counter`` (a rank alone in its process): how many collectives the process performed so far, read
    once the sharder is constructed and as the step ends (``outputs.collectives_performed``).
    """
    recorder = kept.recorder if kept is not None else RecordingComm(comm, progress)
    recorder.calls = CallLog(on_call)  # this step's collectives only
    run = RankRun(outputs=StepOutputs(wire=recorder.calls), kept=kept, counter=counter)
    run.on_step = on_step
    on_gpu = torch.device(device).type == "cuda"
    run.copy_result = defer_after or on_gpu
    before = {"batch": snapshot(inputs.batch), "grammar": snapshot(inputs.grammar)}
    watched = {"batch": inputs.batch, "grammar": inputs.grammar}
    if "owner_table" in inputs.shard_kwargs:  # the engine's, read by the step and never written
        before["owner_table"] = snapshot(inputs.shard_kwargs["owner_table"])
        watched["owner_table"] = inputs.shard_kwargs["owner_table"]
    # Multi-process runs also record collectives issued on comm.group directly.
    intercept = recorder.intercept_torch_distributed() if recorder.group is not None else contextlib.nullcontext()
    release = None
    try:
        with STARTED_THREADS.adopted_by(recorder), intercept:
            try:
                _steps(make_sharder, case, inputs, recorder, device, run, before, watched)
            finally:
                if recorder.group is not None:  # torch.distributed stays patched for the threads left running
                    release = DIRECT_CALLS.held_for(recorder)
    except Exception as exc:  # recorded; the checkers and the report judge it
        out = run.outputs
        out.failed_step, out.error = run.step, exc
        out.error_traceback = cut(traceback.format_exc(), TRACEBACK_LIMIT)
        run.error_in_collective = isinstance(exc, CollectiveError)
    except NotRejected:  # the rank went on where it must raise: INV-REJECT-INVALID judges it
        pass
    finally:
        recorder.progress.enter(step=None)
    if run.performed_from is not None:
        run.outputs.collectives_performed = counter() - run.performed_from
    run.outputs.inputs_modified = [
        name for key, old in before.items() for name in changed_fields(key, old, watched[key])
    ]
    run.outputs.results_sharing_inputs = shared_memory("gathered", run.outputs.gathered, watched)
    if run.kept is not None:
        run.outputs.held_results_modified = run.kept.held.changed()
        run.kept.held.hold(case.case_id, run.outputs.gathered)
    left_running = any(thread.is_alive() for thread in recorder.adopted)
    if not (defer_after or left_running or on_gpu):
        if release is not None:  # nothing can change any more: no second look
            release()
        return run
    gathered = run.outputs.gathered
    after = AfterStep(recorder, before, watched, case.case_id, gathered, device, release, run.returned)
    if defer_after:
        run.after = after
    else:
        after.finish(run.outputs)
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
            **construction_kwargs(make_sharder, case.rules, case.adaptive_verification),
        )
        run.kept = KeptSharder(sharder, recorder)
    if run.counter is not None:  # the engine's start-up in the constructor may issue collectives unrecorded
        run.performed_from = run.counter()
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

    engine_step(
        run.kept.sharder,
        inputs.batch,
        inputs.grammar,
        logits_shard_of,
        sample,
        gather_kwargs(case),
        timed,
        shard_kwargs=inputs.shard_kwargs,
    )


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
    if step == "gather" and (run.copy_result or _left_running(run)):
        run.returned = snapshot(result)  # as returned: a thread the step left running may write into it
    if run.on_step is not None:
        run.on_step(step, run)
    return result


def _left_running(run: RankRun) -> bool:
    recorder = run.kept.recorder if run.kept is not None else None
    return recorder is not None and any(thread.is_alive() for thread in recorder.adopted)


# What is kept of an implementation's exception: a message of megabytes would be printed whole otherwise.
MESSAGE_LIMIT = 4000
TRACEBACK_LIMIT = 20000


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters cut)"


def message_of(error: BaseException) -> str:
    """The message of an implementation's exception, cut to MESSAGE_LIMIT; an exception whose ``__str__``
    raises is the implementation's failure too, said as such (not the suite's)."""
    try:
        text = str(error)
    except Exception as failure:
        text = f"<its str() raised {type(failure).__name__}>"
    return cut(text, MESSAGE_LIMIT)


def error_summary(run: RankRun) -> dict[str, Any] | None:
    out = run.outputs
    if out.error is None:
        return None
    return {
        "step": out.failed_step,
        "type": type(out.error).__name__,
        "message": message_of(out.error),
        "traceback": out.error_traceback,
        "in_collective": run.error_in_collective,
        "precondition_id": getattr(out.error, "precondition_id", None),
    }


def continue_after(case: Case, run: RankRun, plan: RankPlan) -> bool:
    """Whether the group's collectives can still be aligned after this rank's step.

    True when the step completed, or when the error was raised outside a
    collective after as many collectives as every rank of the reference
    raises after (``plan.aligned_wire``: a rejection of replicated inputs).
    Otherwise peers may wait in a collective this rank will never enter.
    """
    out = run.outputs
    if out.error is None:
        return True
    if run.error_in_collective:
        return False
    if declines_extensions(case.extensions, out.error):
        return True  # the declaration is replicated: every rank declines at the same point
    return plan.aligned_wire is not None and len(out.wire) == plan.aligned_wire


def run_case_on_rank(
    case: Case,
    comm,
    impl_name: str,
    make_sharder,
    plan: RankPlan,
    device,
    progress: Progress | None = None,
    on_step: StepCallback | None = None,
    kept: KeptSharder | None = None,
    on_call: Callable[[Any], None] | None = None,
    defer_after: bool = False,
    counter: Callable[[], int | None] | None = None,
) -> tuple[dict[str, Any], KeptSharder | None]:
    """Run ``case`` on ``comm.rank``, unjudged: the record carries the raw ``outputs``; and the sharder,
    kept for a next step of the same case. With ``defer_after`` the record's ``"after_step"`` is the
    step's :class:`AfterStep`, for the caller to finish (and take out of the record) later.

    ``plan`` (:mod:`.rank_plan`) only says where to stop a rank that does not reject and whether the group
    can go on after an error; whether an error was the expected rejection is the judge's to say
    (:func:`shardspec.conformance.judge.rank.judge_rank`): ``case`` may be blinded, without its expected error.
    """
    rank = comm.rank
    inputs = build_case_inputs(case, device)
    stop = plan.rejection_point(rank)  # stops the rank where it must raise
    run = run_step(
        make_sharder,
        case,
        inputs,
        comm,
        device,
        progress,
        stop.steps(on_step),
        kept,
        stop.calls(on_call),
        defer_after,
        counter,
    )
    run.outputs.not_rejected = stop.stopped
    declined = declines_extensions(case.extensions, run.outputs.error)
    return {
        "case_id": case.case_id,
        "rank": rank,
        "impl": impl_name,
        "error": None if declined else error_summary(run),
        "rejection": error_summary(run) if declined else None,
        "timings": {k: round(v, 6) for k, v in run.timings.items()},
        "error_in_collective": run.error_in_collective,
        "aligned": continue_after(case, run, plan),
        "outputs": run.outputs,
        **({"after_step": run.after} if defer_after else {}),
    }, run.kept
