"""One rank's frames of one job, as they arrive, and what they decode to for the judge.

The parent of a multi-process run reads each rank's transcript
(:mod:`.transcript`) into a :class:`FrameLog` per job; once the job has
ended, :func:`decode_frames` rebuilds it as the judge's
:class:`~shardspec.conformance.record.RankTranscript`, saying what could not
be decoded and where.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from shardspec.conformance.harness.transcript import DecodeError, decode
from shardspec.conformance.record import FINAL_FIELDS, STEP_ORDER, STEP_OUTPUT, RankTranscript, StepOutputs


@dataclass
class FrameLog:
    """The frames one rank sent for one job, as they arrive (encoded)."""

    parts: dict[str, Any] = dataclasses.field(default_factory=dict)  # step -> what it returned
    wire: list = dataclasses.field(default_factory=list)  # encoded WireCalls, in issue order
    steps: list[str] = dataclasses.field(default_factory=list)  # steps that returned, in order
    final: dict[str, Any] | None = None  # the job's last frame: its record, a timeout, a harness error, its exit
    undecodable: list[str] = dataclasses.field(default_factory=list)  # frames that could not be read, and why
    last_was_call: bool = False  # the rank's last frame was a collective it entered (and may wait in)
    # What changed in the step's inputs and result after it returned (see harness/after_step.py), sent once the
    # peers finished; the record says when one is to follow.
    after_step: dict[str, Any] | None = None

    @property
    def ended(self) -> bool:
        """Nothing more of this job is needed from the rank: its last frame came (and the look after the step,
        where its record announced one), or one that cannot be read."""
        if self.undecodable:
            return True
        return self.final is not None and (self.final.get("after_step") != "pending" or self.after_step is not None)

    @property
    def finished_step(self) -> bool:
        """The rank sent its record (or a frame that cannot be read): it is past the job's collectives, even where
        the look after its step is still to come."""
        return self.final is not None or bool(self.undecodable)

    def add(self, frame: dict[str, Any]) -> None:
        if "undecodable" in frame:
            self.undecodable.append(frame["undecodable"])
        elif isinstance(frame.get("after_step"), dict) and "outputs" not in frame:
            self.after_step = frame["after_step"]
        elif "call" in frame:
            self.wire.append(frame["call"])
            self.last_was_call = True
        elif "step" in frame and "part" in frame:
            self.steps.append(frame["step"])
            self.parts[frame["step"]] = frame["part"]
            self.last_was_call = False
        else:
            self.final = frame


_STEP_OF = {output: step for step, output in STEP_OUTPUT.items()}


def decode_frames(log: FrameLog, device: str) -> RankTranscript:
    """What ``log`` holds, decoded on ``device`` for the judge; what cannot be decoded is said, with where."""
    final = None if log.final is None else {k: v for k, v in log.final.items() if k not in ("outputs", "after_step")}
    complete = log.final is not None and "outputs" in log.final
    done = [STEP_ORDER.index(s) for s in log.steps if s in STEP_ORDER]
    position = max(done, default=-1) + 1
    transcript = RankTranscript(
        steps=list(log.steps),
        final=final,
        complete=complete,
        undecodable=list(log.undecodable),
        next_step=STEP_ORDER[position] if position < len(STEP_ORDER) else "after the gather",
        after_step_missing=complete and log.final.get("after_step") == "pending" and log.after_step is None,
    )
    for encoded in log.wire:
        try:
            transcript.wire.append(decode(encoded, device))
        except DecodeError:
            break  # the outputs' decode_error says why
    if log.last_was_call and len(transcript.wire) == len(log.wire):
        transcript.waiting_in = transcript.wire[-1].kind
    try:
        transcript.outputs = _outputs(log, complete, device)
    except DecodeError as exc:
        where = exc.path.lstrip(".")
        transcript.decode_error = (_STEP_OF.get(where.split(".")[0].split("[")[0]), where, exc.why)
    return transcript


def _outputs(log: FrameLog, complete: bool, device: str) -> StepOutputs:
    """Raises DecodeError, its path naming the output (``gathered.num_nans``)."""
    out = StepOutputs()
    for step, part in log.parts.items():
        if step in STEP_OUTPUT:
            setattr(out, STEP_OUTPUT[step], _decoded(STEP_OUTPUT[step], part, device))
    out.wire = _decoded("wire", list(log.wire), device)
    for name in FINAL_FIELDS if complete else ():
        setattr(out, name, _decoded(name, log.final["outputs"][name], device))
    if complete and log.after_step is not None:  # written after the step returned
        out.inputs_modified += [n for n in log.after_step.get("inputs_modified", []) if n not in out.inputs_modified]
        out.held_results_modified += [
            c for c in log.after_step.get("held_results_modified", []) if c not in out.held_results_modified
        ]
    return out


def _decoded(name: str, value: Any, device: str) -> Any:
    try:
        return decode(value, device)
    except DecodeError as exc:
        raise exc.within(name) from None
