"""The judge: verdicts from what the ranks handed over, for every way of running them.

A group (the harness) runs the ranks and hands the judge what each rank
returned: the in-process groups a rank record with its outputs
(:meth:`Judge.rank`, then :meth:`Judge.case`); a multi-process run the
ranks' transcripts, decoded from their frames by the harness
(:meth:`Judge.transcripts`). In a multi-process run the judge is the parent,
which never imports the implementation under test. A rank that died in step
k still gets verdicts for the steps before k: the invariants of the steps it
finished are judged on what it sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardspec.conformance.judge.rank import judge_rank, returned_steps
from shardspec.conformance.judge.results import combine
from shardspec.conformance.record import CaseResult, Expectation, RankTranscript
from shardspec.spec.case import Case, build_case_inputs


class Judge:
    """Verdicts for the cases of one run.

    ``expect(case, device)`` is the reference's expectation of a case on a
    device (the harness computes it: it runs the reference); ``device`` is
    where this judge rebuilds a case's inputs and the ranks' outputs, the
    device the ranks ran on (``at`` gives the judge of another).
    """

    def __init__(self, expect: Callable[[Case, str], Expectation], device: str = "cpu"):
        self.expect = expect
        self.device = device
        self._inputs: dict[str, Any] = {}

    def at(self, device: str) -> Judge:
        """This judge for ranks on ``device`` (float results differ in the last bits between devices)."""
        return self if device == self.device else Judge(self.expect, device)

    def expectation(self, case: Case) -> Expectation:
        return self.expect(case, self.device)

    def rank(self, case: Case, record: dict[str, Any], completed: set[str] | None = None) -> dict[str, Any]:
        """One rank's record of ``case`` (with its ``outputs``), judged."""
        return judge_rank(case, record, self.expectation(case), self.inputs(case), completed)

    def case(self, case: Case, label: str, records: dict[int, dict[str, Any]], ended: str | None = None) -> CaseResult:
        """The judged records of every rank of ``case`` combined; ``ended``: why missing ranks stopped."""
        return combine(case, label, records, ended=ended)

    def transcripts(
        self,
        case: Case,
        label: str,
        transcripts: dict[int, RankTranscript],
        ended: str | None = None,
        culprit: dict[str, Any] | None = None,
    ) -> CaseResult:
        """``culprit``: the rank whose process ended the launch, with how (``{"rank", "how"}``)."""
        records = {}
        lost = self.lost_peers(case, transcripts, culprit)
        for rank, transcript in transcripts.items():
            record = self.rank_record(case, rank, transcript, ended, culprit, rank in lost)
            if record is not None:
                records[rank] = record
        if culprit is not None and culprit.get("rank") is not None and culprit["rank"] not in records:
            records[culprit["rank"]] = _died(case, culprit["rank"], RankTranscript(), ended, culprit)
        if any("digest" not in r or r.get("error") for r in records.values()) or len(records) < case.tp_size:
            for rank, message in self.mismatches(case, transcripts).items():
                records.setdefault(rank, {"rank": rank, "case_id": case.case_id})["mismatch"] = message
        return self.case(case, label, records, ended)

    def mismatches(self, case: Case, transcripts: dict[int, RankTranscript]) -> dict[int, str]:
        """Ranks whose collectives left the plan the spec gives them (what breaks a group's collective)."""
        expected = self.expectation(case).expected
        found = {}
        for rank, transcript in sorted(transcripts.items()):
            want = expected[rank].wire
            for position, call in enumerate(transcript.wire):
                difference = (
                    "is one more than the plan has" if position >= len(want) else call_difference(call, want[position])
                )
                if difference:
                    found[rank] = f"rank {rank}'s collective {position} ({call.kind}) {difference}"
                    break
        return found

    def lost_peers(
        self, case: Case, transcripts: dict[int, RankTranscript], culprit: dict[str, Any] | None
    ) -> set[int]:
        """Ranks that only lost a peer: each raised inside a collective its plan has (it went no further than
        the reference), while another rank of the group failed on its own (it died, hung outside a
        collective, sent what cannot be read, raised where the reference does not, or sent nothing). Their
        error is the peer's doing: they are judged on the steps they finished only, never on that error."""
        expected = self.expectation(case).expected
        failed = {rank for rank in range(case.tp_size) if _failed_on_its_own(rank, transcripts.get(rank), expected)}
        if culprit is not None and isinstance(culprit.get("rank"), int):
            failed.add(culprit["rank"])
        lost = set()
        for rank, transcript in transcripts.items():
            final = transcript.final or {}
            if (
                transcript.complete
                and final.get("error_in_collective")
                and failed - {rank}
                and transcript.outputs is not None
                and not transcript.outputs.not_rejected
                and len(transcript.wire) <= len(expected[rank].wire)
            ):
                lost.add(rank)
        return lost

    def rank_record(
        self,
        case: Case,
        rank: int,
        transcript: RankTranscript,
        ended: str | None,
        culprit: dict[str, Any] | None,
        peer_lost: bool = False,
    ) -> dict[str, Any] | None:
        """``peer_lost``: the rank's error followed a peer's failure (:meth:`lost_peers`)."""
        final = transcript.final
        culprit_here = culprit is not None and culprit.get("rank") == rank
        if transcript.undecodable and not culprit_here and (final is None or transcript.complete):
            return _undecodable(case, rank, transcript.next_step, "; ".join(transcript.undecodable))
        if transcript.complete:
            if transcript.decode_error is not None:
                step, where, why = transcript.decode_error
                return _undecodable(case, rank, step, f"rank {rank}'s {where} could not be decoded: {why}")
            if peer_lost:
                return _lost_peer(
                    case,
                    rank,
                    transcript,
                    self.rank(case, {**final, "outputs": transcript.outputs}, returned_steps(transcript.outputs)),
                )
            judged = self.rank(case, {**final, "outputs": transcript.outputs})
            if culprit_here and transcript.after_step_missing:  # it died after returning: its thread, say
                return {**_died(case, rank, transcript, ended, culprit), "violations": judged.get("violations", [])}
            return judged
        partial = self.partial_violations(case, rank, transcript)
        if final is not None and "exited" in final:  # the implementation ended the rank's process (sys.exit)
            how = {"how": f"exited with status {final['exited']}"}
            return {**_died(case, rank, transcript, ended, how), "violations": partial}
        if final is not None:  # the rank reported a hang or a failure of the suite itself
            return {**final, "violations": partial}
        if culprit_here:
            return {**_died(case, rank, transcript, ended, culprit), "violations": partial}
        if culprit is None and ended is not None and (transcript.steps or transcript.wire):
            return {**_unfinished(case, rank, transcript, ended), "violations": partial}
        if partial:
            return {
                "rank": rank,
                "case_id": case.case_id,
                "violations": partial,
                "stopped": f"in step {transcript.next_step}",
            }
        return None

    def partial_violations(self, case: Case, rank: int, transcript: RankTranscript) -> list[dict[str, Any]]:
        if not transcript.steps or transcript.outputs is None:  # nothing of it can be judged
            return []
        record = {"rank": rank, "impl": "", "outputs": transcript.outputs}
        return self.rank(case, record, completed=set(transcript.steps))["violations"]

    def inputs(self, case: Case):
        if case.case_id not in self._inputs:
            if len(self._inputs) >= _INPUTS_KEPT:
                del self._inputs[next(iter(self._inputs))]
            self._inputs[case.case_id] = build_case_inputs(case, self.device)
        return self._inputs[case.case_id]


# Ranks hand over one case after another (threads a few apart): the inputs of the last few are kept.
_INPUTS_KEPT = 16


def _undecodable(case: Case, rank: int, step: str | None, why: str) -> dict[str, Any]:
    return {"rank": rank, "case_id": case.case_id, "step": step, "undecodable": why}


def _failed_on_its_own(rank: int, transcript: RankTranscript | None, expected) -> bool:
    """Whether ``rank`` failed whatever its peers did (see :meth:`Judge.lost_peers`)."""
    if transcript is None or transcript.undecodable or transcript.final is None:
        return True  # never heard of in this job, unreadable, or ended without its last frame
    final = transcript.final
    if "exited" in final or final.get("harness_error") or (final.get("timeout") and not final.get("in_collective")):
        return True
    raised = final.get("error") or final.get("rejection")
    if not raised or raised.get("in_collective"):
        return False
    want = expected[rank]
    return want.error is None or want.failed_step != raised.get("step")


def _lost_peer(case: Case, rank: int, transcript: RankTranscript, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` of a rank that lost a peer: its error (or rejection) becomes that loss, judged on nothing."""
    raised = record.pop("error", None) or record.pop("rejection", None) or {}
    record["error"] = None
    where = f" in {transcript.wire[-1].kind}" if transcript.wire else ""
    record["peer_lost"] = (
        f"rank {rank} lost its peer{where} in step {raised.get('step')} of case {case.case_id}: "
        f"{raised.get('type', 'an error')}: {raised.get('message', '')}"
    )
    record["peer_lost_step"] = raised.get("step")
    return record


def _died(
    case: Case, rank: int, transcript: RankTranscript, ended: str | None, culprit: dict[str, Any]
) -> dict[str, Any]:
    return {
        "rank": rank,
        "case_id": case.case_id,
        "step": transcript.next_step,
        "died": f"rank {rank} {culprit['how']} in step {transcript.next_step} of case {case.case_id}"
        + (f" ({ended})" if ended else ""),
    }


def _unfinished(case: Case, rank: int, transcript: RankTranscript, ended: str) -> dict[str, Any]:
    """A rank the parent stopped with no culprit known (e.g. every rank silent, one holding the GIL): where it
    was. One outside any collective did not return from its step; one in a collective waited for it."""
    step = transcript.next_step
    where = f"waited in {transcript.waiting_in}" if transcript.waiting_in else "did not return"
    return {
        "rank": rank,
        "case_id": case.case_id,
        "step": step,
        "in_collective": transcript.waiting_in is not None,
        "timeout": f"rank {rank} {where} in step {step} of case {case.case_id} ({ended})",
    }


def call_difference(call, want) -> str | None:
    """How a recorded call differs from the one the reference issues at its place (None: it does not)."""
    if call.kind != want.kind:
        return f"is not the {want.kind} the plan has there"
    for name in ("output_shape", "input_split_sizes", "output_split_sizes"):
        got, expected = getattr(call, name, None), getattr(want, name, None)
        if got is not None and expected is not None and list(got) != list(expected):
            return f"has {name} {list(got)}, the plan {list(expected)}"
    send, expected_send = getattr(call, "send", None), getattr(want, "send", None)
    if send is not None and expected_send is not None and tuple(send.shape) != tuple(expected_send.shape):
        return f"sends shape {list(send.shape)}, the plan {list(expected_send.shape)}"
    return None
