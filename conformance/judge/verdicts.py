"""The judge of a multi-process run: it turns the ranks' transcripts into verdicts.

It runs in the parent, which never imports the implementation under test:
the ranks only run steps and stream what the implementation returned
(:mod:`.transcript`); the checkers run here, on data rebuilt from those
frames. A rank that died in step k still gets verdicts for the steps before
k: the invariants of the steps it finished are judged on what it sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardspec.conformance.harness.transcript import FINAL_FIELDS, DecodeError, decode
from shardspec.conformance.judge.checks.base import StepOutputs
from shardspec.conformance.judge.results import CaseResult, combine
from shardspec.conformance.step import STEP_OUTPUT, judge_rank
from shardspec.spec.case import Case, build_case_inputs

STEP_ORDER = ("construct", "shard", "all_to_all", "sample", "gather")


@dataclass
class RankTranscript:
    """The frames one rank sent for one job."""

    parts: dict[str, Any] = field(default_factory=dict)  # step -> what it returned (encoded)
    wire: list = field(default_factory=list)  # encoded WireCalls, in issue order
    steps: list[str] = field(default_factory=list)  # steps that returned, in order
    final: dict[str, Any] | None = None  # the job's last frame: its record, a timeout or a harness error
    undecodable: list[str] = field(default_factory=list)  # frames that could not be read, and why

    @property
    def ended(self) -> bool:
        """Nothing more of this job is needed from the rank: its last frame came, or one that cannot be read."""
        return self.final is not None or bool(self.undecodable)

    def add(self, frame: dict[str, Any]) -> None:
        if "undecodable" in frame:
            self.undecodable.append(frame["undecodable"])
        elif "call" in frame:
            self.wire.append(frame["call"])
        elif "step" in frame and "part" in frame:
            self.steps.append(frame["step"])
            self.parts[frame["step"]] = frame["part"]
        else:
            self.final = frame

    def next_step(self) -> str:
        """The step the rank was in after the last one it finished."""
        done = [STEP_ORDER.index(s) for s in self.steps if s in STEP_ORDER]
        position = max(done, default=-1) + 1
        return STEP_ORDER[position] if position < len(STEP_ORDER) else "after the gather"


class Judge:
    """Verdicts for the jobs of one group size, from transcripts."""

    def __init__(self, expectations: dict[str, Any], device_kind: str):
        self.expectations = expectations
        self.device = "cuda" if device_kind == "cuda" else "cpu"
        self._inputs: dict[str, Any] = {}

    def case_result(
        self,
        case: Case,
        label: str,
        transcripts: dict[int, RankTranscript],
        ended: str | None = None,
        culprit: dict[str, Any] | None = None,
    ) -> CaseResult:
        """``culprit``: the rank whose process ended the launch, with how (``{"rank", "how"}``)."""
        records = {}
        for rank, transcript in transcripts.items():
            record = self.rank_record(case, rank, transcript, ended, culprit)
            if record is not None:
                records[rank] = record
        if culprit is not None and culprit.get("rank") is not None and culprit["rank"] not in records:
            records[culprit["rank"]] = _died(case, culprit["rank"], RankTranscript(), ended, culprit)
        if any("digest" not in r or r.get("error") for r in records.values()) or len(records) < case.tp_size:
            for rank, message in self.mismatches(case, transcripts).items():
                records.setdefault(rank, {"rank": rank, "case_id": case.case_id})["mismatch"] = message
        return combine(case, label, records, ended=ended)

    def mismatches(self, case: Case, transcripts: dict[int, RankTranscript]) -> dict[int, str]:
        """Ranks whose collectives left the plan the spec gives them (what breaks a group's collective)."""
        expected = self.expectations[case.case_id].expected
        found = {}
        for rank, transcript in sorted(transcripts.items()):
            want = expected[rank].wire
            for position, encoded in enumerate(transcript.wire):
                try:
                    call = decode(encoded, self.device)
                except DecodeError:
                    break  # the rank's record says why
                difference = (
                    "is one more than the plan has" if position >= len(want) else call_difference(call, want[position])
                )
                if difference:
                    found[rank] = f"rank {rank}'s collective {position} ({call.kind}) {difference}"
                    break
        return found

    def rank_record(
        self, case: Case, rank: int, transcript: RankTranscript, ended: str | None, culprit: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        final = transcript.final
        culprit_here = culprit is not None and culprit.get("rank") == rank
        if transcript.undecodable and not culprit_here and (final is None or "outputs" in final):
            return _undecodable(case, rank, transcript.next_step(), "; ".join(transcript.undecodable))
        if final is not None and "outputs" in final:
            record = dict(final)
            try:
                record["outputs"] = self.outputs(transcript, final["outputs"])
            except DecodeError as exc:
                where = exc.path.lstrip(".")
                why = f"rank {rank}'s {where} could not be decoded: {exc.why}"
                return _undecodable(case, rank, _STEP_OF.get(where.split(".")[0].split("[")[0]), why)
            return judge_rank(case, record, self.expectations[case.case_id], self.inputs(case))
        partial = self.partial_violations(case, rank, transcript)
        if final is not None:  # the rank reported a hang or a failure of the suite itself
            return {**final, "violations": partial}
        if culprit is not None and culprit.get("rank") == rank:
            return {**_died(case, rank, transcript, ended, culprit), "violations": partial}
        if partial:
            return {
                "rank": rank,
                "case_id": case.case_id,
                "violations": partial,
                "stopped": f"in step {transcript.next_step()}",
            }
        return None

    def partial_violations(self, case: Case, rank: int, transcript: RankTranscript) -> list[dict[str, Any]]:
        if not transcript.steps:
            return []
        try:
            record = {"rank": rank, "impl": "", "outputs": self.outputs(transcript, None)}
        except DecodeError:  # nothing of it can be judged
            return []
        judged = judge_rank(
            case, record, self.expectations[case.case_id], self.inputs(case), completed=set(transcript.steps)
        )
        return judged["violations"]

    def outputs(self, transcript: RankTranscript, final: dict[str, Any] | None) -> StepOutputs:
        """What the rank's frames hold; raises DecodeError, its path naming the output (``gathered.num_nans``)."""
        out = StepOutputs()
        for step, part in transcript.parts.items():
            if step in STEP_OUTPUT:
                setattr(out, STEP_OUTPUT[step], self._decoded(STEP_OUTPUT[step], part))
        out.wire = self._decoded("wire", list(transcript.wire))
        for name in FINAL_FIELDS if final else ():
            setattr(out, name, self._decoded(name, final[name]))
        return out

    def _decoded(self, name: str, value: Any) -> Any:
        try:
            return decode(value, self.device)
        except DecodeError as exc:
            raise exc.within(name) from None

    def inputs(self, case: Case):
        if case.case_id not in self._inputs:
            self._inputs[case.case_id] = build_case_inputs(case, self.device)
        return self._inputs[case.case_id]


_STEP_OF = {output: step for step, output in STEP_OUTPUT.items()}


def _undecodable(case: Case, rank: int, step: str | None, why: str) -> dict[str, Any]:
    return {"rank": rank, "case_id": case.case_id, "step": step, "undecodable": why}


def _died(
    case: Case, rank: int, transcript: RankTranscript, ended: str | None, culprit: dict[str, Any]
) -> dict[str, Any]:
    return {
        "rank": rank,
        "case_id": case.case_id,
        "step": transcript.next_step(),
        "died": f"rank {rank} {culprit['how']} in step {transcript.next_step()} of case {case.case_id}"
        + (f" ({ended})" if ended else ""),
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
