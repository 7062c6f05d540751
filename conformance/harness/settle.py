"""A job's transcripts, once complete (or once its launch broke), judged into its result."""

from __future__ import annotations

import dataclasses
import traceback

from shardspec.conformance.harness.frames import decode_frames
from shardspec.conformance.harness.group import Job
from shardspec.conformance.record import ERROR, FAIL, NOT_RUN, CaseResult


class Settler:
    """Turns complete transcripts into results, in job order."""

    def __init__(self, jobs, results, follower, judge, on_result, names: dict[str, str] | None = None):
        """``follower``: the launch's (set once it starts); ``names``: the ranks' names of the cases
        (harness/rank_plan.py's ``blinded``) to their ids."""
        self.jobs, self.results, self.follower, self.judge, self.on_result = jobs, results, follower, judge, on_result
        self.names = names or {}

    def complete(self, indices) -> None:
        for index in indices:
            if index in self.results:
                continue
            groups = self.follower.group_transcripts(index)
            if any(sum(t.ended for t in ranks.values()) < self.jobs[index].case.tp_size for ranks in groups):
                return  # jobs finish in order: nothing later is complete either
            self.settle(index, groups)

    def settle(self, index, groups, ended: str | None = None, culprit=None) -> None:
        """``groups``: each TP group's transcripts by rank in the group (one group's alone: that group's);
        ``culprit``: its rank is a world rank."""
        groups = [groups] if isinstance(groups, dict) else list(groups) or [{}]
        job = self.jobs[index]
        tp = job.case.tp_size
        results = [
            self._judged(job, ranks, ended, _in_group(culprit, number, tp)) for number, ranks in enumerate(groups)
        ]
        self.results[index] = results[0] if len(results) == 1 else across_groups(results, tp)
        if self.on_result:
            self.on_result(self.results[index])

    def _judged(self, job, transcripts, ended, culprit) -> CaseResult:
        try:
            decoded = {rank: decode_frames(log, self.judge.device) for rank, log in transcripts.items()}
            for transcript in decoded.values():
                self._named(transcript.outputs)
            return self.judge.transcripts(job.case, job.choice.label, decoded, ended, culprit)
        except Exception as exc:  # a defect of the judge: this case, not the run, ends with it
            return judge_failed(job, exc)

    def _named(self, outputs) -> None:
        """The earlier steps' results a rank reports changed, by the cases' ids rather than its names for them."""
        for changed in getattr(outputs, "held_results_modified", None) or []:
            name, dot, rest = str(changed.get("field", "")).partition(".gathered")
            changed["field"] = self.names.get(name, name) + dot + rest

    def broken_job(self, indices, ended, culprit) -> None:
        """The first unfinished job fails with what is known, unless a rank left on purpose before it."""
        for index in indices:
            if index in self.results:
                continue
            groups = self.follower.group_transcripts(index)
            if any(groups) or not self.follower.left_on_purpose:
                self.settle(index, groups, ended, culprit)
            return


def _in_group(culprit: dict | None, group: int, tp: int) -> dict | None:
    """The launcher's culprit (a world rank) as seen by TP group ``group``: its rank there, or None."""
    if culprit is None or not isinstance(culprit.get("rank"), int):
        return culprit
    if culprit["rank"] // tp != group:
        return None
    return {**culprit, "rank": culprit["rank"] % tp}


def across_groups(results: list[CaseResult], tp: int) -> CaseResult:
    """One job's result in a world of several TP groups, each of which ran it: every group's violations and
    errors, each message naming its group; the worst status; a pass only where every group passed."""

    def named(entries: list[dict], group: int) -> list[dict]:
        where = f"TP group {group} (world ranks {group * tp}-{group * tp + tp - 1})"
        return [{**entry, "message": f"{where}: {entry.get('message', '')}"} for entry in entries]

    violations = [v for number, result in enumerate(results) for v in named(result.violations, number)]
    errors = [e for number, result in enumerate(results) for e in named(result.errors, number)]
    statuses = [result.status for result in results]
    status = next((s for s in (ERROR, FAIL, NOT_RUN) if s in statuses), statuses[0])
    judged = set.intersection(*(set(result.judged) for result in results)) | {v["invariant_id"] for v in violations}
    keys = {key for result in results for key in result.timings}
    timings = {key: max(result.timings.get(key, 0.0) for result in results) for key in keys}
    reason = "; ".join(dict.fromkeys(result.reason for result in results if result.reason))
    return dataclasses.replace(
        results[0],
        status=status,
        violations=violations,
        errors=errors,
        judged=sorted(judged),
        timings=timings,
        reason=reason,
    )


def judge_failed(job: Job, exc: Exception) -> CaseResult:
    message = f"the judge failed on this case's transcripts: {type(exc).__name__}: {exc}"
    error = {"rank": None, "kind": "harness", "message": message, "traceback": traceback.format_exc()}
    return CaseResult(job.case, job.choice.label, ERROR, errors=[error])
