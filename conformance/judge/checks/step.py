"""The whole step: ranks agree, sharding is transparent, inputs stay untouched."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from shardspec.conformance.judge.checks.base import StepRecord, Violation, group_check, rank_check
from shardspec.conformance.judge.checks.common import first_bad_row, fmt, judgeable, values_equal
from shardspec.reference.profile_rules import device_cu_num_logits
from shardspec.spec.case import Case

# Metadata fields that legitimately differ between ranks.
PER_RANK_METADATA = ("num_local_logits", "num_local_reqs")


@group_check("INV-RANK-AGREEMENT")
def check_rank_agreement(case: Case, digests: dict[int, dict[str, Any]]) -> Iterable[Violation]:
    """Compares the digests of conformance.digest: "gathered", "sorted_logits_indices", "metadata"."""
    if case.expect_error is not None or any(d.get("failed_step") for d in digests.values()):
        return
    first_rank = min(digests)
    base = _agreed_part(digests[first_rank])
    for rank in sorted(digests):
        part = _agreed_part(digests[rank])
        for name in base:
            if part[name] != base[name]:
                field = _first_difference(name, part[name], base[name])
                yield Violation(
                    "INV-RANK-AGREEMENT",
                    f"{field} differs: rank {rank} has "
                    f"{_lookup(part, field)}, rank {first_rank} has {_lookup(base, field)}",
                    rank=rank,
                    field=field,
                )
                return


def _agreed_part(digest: dict[str, Any]) -> dict[str, Any]:
    metadata = {k: v for k, v in (digest.get("metadata") or {}).items() if k not in PER_RANK_METADATA}
    return {
        "gathered": digest.get("gathered"),
        "sorted_logits_indices": digest.get("sorted_logits_indices"),
        "metadata": metadata,
    }


def _first_difference(name: str, got: Any, want: Any) -> str:
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want)):
            if got.get(key) != want.get(key):
                return f"{name}.{key}"
    return name


def _lookup(part: dict[str, Any], path: str) -> Any:
    value: Any = part
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


@rank_check("INV-E2E-TRANSPARENCY")
def check_e2e_transparency(record: StepRecord) -> Iterable[Violation]:
    replicated, actual = record.replicated, record.actual.gathered
    if not judgeable(record) or replicated is None or actual is None:
        return
    violation = _compare_counts(record, actual, replicated) or _compare_logprobs(record, actual, replicated)
    if violation:
        yield violation


def _as_list(value: Any) -> list | None:
    return value.detach().cpu().tolist() if isinstance(value, torch.Tensor) else None


def _violation(record: StepRecord, field: str, request: int | None, got: Any, want: Any) -> Violation:
    return Violation(
        "INV-E2E-TRANSPARENCY",
        f"{field}: sharded {fmt(got)}, replicated {fmt(want)}",
        rank=record.rank,
        request=request,
        field=field,
    )


def _compare_counts(record: StepRecord, actual, replicated) -> Violation | None:
    names = ["num_sampled", "num_rejected"] + (["num_nans"] if record.case.gather_num_nans else [])
    for name in names:
        got, want = _as_list(getattr(actual, name)), _as_list(getattr(replicated, name))
        if got != want:
            request = next((i for i, (a, b) in enumerate(zip(got or [], want, strict=False)) if a != b), None)
            return _violation(record, f"gathered.{name}", request, got, want)
    got_ids, want_ids = _as_list(actual.sampled_token_ids), _as_list(replicated.sampled_token_ids)
    for i, count in enumerate(_as_list(replicated.num_sampled)):
        # Entries at or beyond num_sampled are not compared (CL-REPLICATED-DIFFERENCES).
        got = None if got_ids is None or i >= len(got_ids) else got_ids[i][:count]
        if got != want_ids[i][:count]:
            return _violation(record, "gathered.sampled_token_ids", i, got, want_ids[i][:count])
    return None


def _compare_logprobs(record: StepRecord, actual, replicated) -> Violation | None:
    want = replicated.logprobs_tensors
    if want is None:
        return None
    got = actual.logprobs_tensors
    field = "gathered.logprobs_tensors"
    if got is None:
        return _violation(record, field, None, None, "logprobs")
    row_request = _row_request(record)
    rows = len(row_request)  # the replicated path has the L admitted rows; rows from L on are unspecified
    for name in ("logprob_token_ids", "logprobs", "selected_token_ranks"):
        a, b = getattr(got, name), getattr(want, name)
        if not isinstance(a, torch.Tensor) or a.shape[0] < rows or a.shape[1:] != b.shape[1:]:
            return _violation(record, f"{field}.{name}", None, a if a is None else list(a.shape), list(b.shape))
        a = a[:rows]
        row = first_bad_row(values_equal(a.cpu().double(), b.cpu().double()))
        if row is not None:
            return _violation(record, f"{field}.{name}", row_request[row], a[row], b[row])
    if got.cu_num_generated_tokens != want.cu_num_generated_tokens:
        return _violation(
            record, f"{field}.cu_num_generated_tokens", None, got.cu_num_generated_tokens, want.cu_num_generated_tokens
        )
    return None


def _row_request(record: StepRecord) -> list[int]:
    """The request of each logits row of the batch, as the device fields lay them out."""
    cu = device_cu_num_logits(record.inputs.batch, record.case.rules)
    return [i for i in range(len(cu) - 1) for _ in range(int(cu[i + 1] - cu[i]))]


@rank_check("INV-INPUTS-UNCHANGED", applies=lambda record: True)  # rejected inputs stay unchanged too
def check_inputs_unchanged(record: StepRecord) -> Iterable[Violation]:
    changed = record.actual.inputs_modified
    if changed:
        yield Violation(
            "INV-INPUTS-UNCHANGED",
            f"the step modified its inputs: {', '.join(changed)}",
            rank=record.rank,
            field=changed[0],
        )


# Fields of a gathered result with one row per request (the others have one per logits row).
PER_REQUEST_FIELDS = ("sampled_token_ids", "num_sampled", "num_rejected", "num_nans")


@rank_check("INV-GATHER-RESULT-OWNED", applies=lambda record: record.actual.gathered is not None)
def check_gather_result_owned(record: StepRecord) -> Iterable[Violation]:
    shared = record.actual.results_sharing_inputs
    if shared:
        yield Violation(
            "INV-GATHER-RESULT-OWNED",
            "the gathered result lies in the memory of an input of the step, which the caller reuses: "
            + ", ".join(f"{s['field']} in {s['input']}" for s in shared),
            rank=record.rank,
            field=shared[0]["field"],
        )


@rank_check(
    "INV-GATHER-RESULT-STABLE",
    applies=lambda record: bool(record.case.continues) or bool(record.actual.held_results_modified),
)
def check_gather_result_stable(record: StepRecord) -> Iterable[Violation]:
    """Judged on the later steps of a multi-step case (the harness holds every earlier gathered result), and
    on any step whose own result changed after the gather returned it (the harness looks again once the
    peers finished, or the threads the step left running ended)."""
    changed = record.actual.held_results_modified
    if not changed:
        return
    first = changed[0]
    earlier, _, name = first["field"].partition(".gathered.")
    row, unit = first["row"], "request" if name in PER_REQUEST_FIELDS else "logits row"
    # The row is a position in the earlier step's batch, not in this one's: it goes in the message.
    at = "" if row is None else f" (first at its {unit} {row})"
    fields = ", ".join(c["field"] for c in changed)
    what = (
        "the result this step returned changed after the gather returned it (a write the step left running)"
        if earlier == record.case.case_id
        else f"this step wrote into the result that step {earlier} returned"
    )
    yield Violation(
        "INV-GATHER-RESULT-STABLE",
        f"{what}: {fields}{at}",
        rank=record.rank,
        field=first["field"],
    )
