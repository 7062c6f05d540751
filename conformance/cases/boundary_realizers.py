"""How a boundary of a precondition (cases/boundaries.py) becomes a case: :data:`REALIZERS`, keyed by the
boundary's first field, side and value, each the change of a valid batch that puts that field at that value
(None where the case's profile or group size has no such violation)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from shardspec.conformance.cases.batches import local_requests
from shardspec.spec.case import Case, ExplicitLocalOutput, least_capacity
from shardspec.spec.case_edits import UPPER_BOUND_ABSENT


def _counts(case: Case, counts: list[int]) -> Case:
    return replace(case, num_logits_per_req=counts)


def _one_at(case: Case, value: int, rng) -> list[int]:
    counts = list(case.num_logits_per_req)
    counts[int(rng.integers(len(counts)))] = value
    return counts


def _slot_at(value_of: Callable) -> Callable:
    def realize(case, rng):
        slots = list(case.slots)
        slots[int(rng.integers(len(slots)))] = value_of(case)
        return replace(case, slots=slots)

    return realize


def _requests_over_capacity(case) -> int:
    """How many requests a batch needs so that one slot fewer is still a slot per rank where the profile
    needs one (PRE-CAPACITY-TP): the batch, not the capacity, is then at fault."""
    least = least_capacity(case)
    return len(case.slots) if least == 1 else max(len(case.slots), least + 1)


def _capacity_below_batch(case, rng):
    n = _requests_over_capacity(case)
    return replace(case, slots=list(range(n)), num_logits_per_req=[1] * n, max_num_reqs=n - 1)


def _capacity_at_largest_slot(case, rng):
    largest = max(max(case.slots), len(case.slots), least_capacity(case))
    slots = list(case.slots)
    if largest not in slots:
        slots[0] = largest
    return replace(case, slots=slots, max_num_reqs=largest)


def _bound_absent(case, rng):
    """No seq_lens_cpu_upper_bound: a violation only where the engine always passes one."""
    return replace(case, edits=[UPPER_BOUND_ABSENT]) if case.rules.upper_bound_required else None


def _group_of_one(case, rng):
    """A valid batch in a group of one: only a tp 1 case breaks PRE-TP-SIZE."""
    return case if case.tp_size == 1 else None


def _fewer_slots_than_ranks(case, rng):
    """One request in slot 0 of a sharder with tp - 1 slots (PRE-CAPACITY-TP); no such sharder at tp 1."""
    if case.tp_size < 2:
        return None
    return replace(case, slots=[0], num_logits_per_req=[1], max_num_reqs=case.tp_size - 1)


def _repeat_slot(case, rng):
    return replace(
        case,
        slots=[*case.slots, case.slots[int(rng.integers(len(case.slots)))]],
        num_logits_per_req=[*case.num_logits_per_req, 1],
    )


def _grammar(case: Case, **fields) -> Case:
    return replace(case, grammar_positions=list(range(len(case.slots))), **fields)


def _explicit_outputs(case: Case, shorten: str | None = None, drop_rank: bool = False, by: int = -1) -> Case:
    """Valid explicit outputs for every owning rank, each with ``shorten`` one entry short (``by`` -1) or
    long (``by`` 1) (or, with ``drop_rank``, every owning rank passing None)."""
    outputs = {}
    for rank in range(case.tp_size):
        owned = local_requests(case, rank)
        if not owned:
            continue
        rows = sum(case.num_logits_per_req[i] for i in owned)
        out = ExplicitLocalOutput(
            sampled_token_ids=[[1] for _ in owned],
            num_sampled=[1] * len(owned),
            num_rejected=[0] * len(owned),
            num_nans=[0] * rows,
            logprob_token_ids=[[1, 2, 3] for _ in range(rows)],
            logprobs=[[-0.5, -1.0, -2.0] for _ in range(rows)],
            selected_token_ranks=[0] * rows,
        )
        names = ("logprob_token_ids", "logprobs", "selected_token_ranks") if shorten == "logprobs_tensors" else ()
        if shorten is not None:
            out = replace(out, **{name: _one_off(getattr(out, name), by) for name in names or (shorten,)})
        outputs[rank] = out
    if drop_rank:
        outputs = {}  # every owning rank passes None
    return replace(case, local_outputs=outputs, logprobs_dims=(2, 0), gather_num_nans=True)


def _one_off(values: list, by: int) -> list:
    """``values`` one entry short (``by`` -1) or long (``by`` 1: its last entry repeated)."""
    return values[:-1] if by < 0 else [*values, values[-1]]


def _edit(name: str) -> Callable:
    return lambda case, rng: replace(case, edits=[name])


REALIZERS: dict[str, Callable] = {
    "sharder.tp_size:below=1": _group_of_one,
    "sharder.max_num_reqs:below=tp - 1": _fewer_slots_than_ranks,
    "sharder.tp_size:above=max_num_reqs + 1": _fewer_slots_than_ranks,  # the same sharder, seen from the group
    "batch.req_ids:below=num_reqs - 1": _edit("req-ids-short"),
    "batch.num_reqs:above=max_num_reqs + 1": _capacity_below_batch,  # the same batch, seen from the capacity
    "sharder.max_num_reqs:below=num_reqs - 1": _capacity_below_batch,
    "batch.idx_mapping:other=float32": lambda c, r: replace(c, batch_dtypes={"idx_mapping": "float32"}),
    "batch.idx_mapping:other=int16": lambda c, r: replace(c, batch_dtypes={"idx_mapping": "int16"}),
    "batch.cu_num_logits:other=float32": lambda c, r: replace(c, batch_dtypes={"cu_num_logits": "float32"}),
    "batch.cu_num_logits:other=int16": lambda c, r: replace(c, batch_dtypes={"cu_num_logits": "int16"}),
    "batch.idx_mapping:below=-1": _slot_at(lambda c: -1),
    "batch.idx_mapping:above=max_num_reqs": _slot_at(lambda c: c.max_num_reqs),
    "sharder.max_num_reqs:below=largest slot": _capacity_at_largest_slot,
    "batch.idx_mapping:other=repeat": _repeat_slot,
    "batch.cu_num_logits_np:above=cu_num_logits_np[0] = 1": _edit("cu-logits-from-one"),
    "batch.cu_num_logits:below=0": lambda c, r: _counts(c, _one_at(c, 0, r)),
    "batch.cu_num_logits:above=max_num_logits_per_req + 1": lambda c, r: _counts(
        c, _one_at(c, c.max_num_logits_per_req + 1, r)
    ),
    "sharder.max_num_logits_per_req:below=largest n_i - 1": lambda c, r: replace(
        _counts(c, _one_at(c, 3, r)), max_num_logits_per_req=2
    ),
    "batch.seq_lens:below=N - 1": _edit("seq-lens-short"),
    "batch.seq_lens_cpu_upper_bound:below=N - 1": _edit("seq-lens-upper-bound-short"),
    "batch.num_draft_tokens:above=sum + 1": lambda c, r: replace(
        _counts(c, _one_at(c, 2, r)), edits=["draft-total-plus-one"]
    ),
    "batch.num_draft_tokens_per_req:other=None": lambda c, r: replace(_counts(c, _one_at(c, 2, r)), spec_decode=False),
    "batch.num_admitted_draft_tokens:above=num_draft_tokens_per_req + 1": lambda c, r: replace(
        _counts(c, [2] * len(c.slots)),
        adaptive_verification=True,
        admitted_drafts=_one_at(_counts(c, [0] * len(c.slots)), 2, r),
    ),
    "batch.num_admitted_draft_tokens:below=-1": lambda c, r: replace(
        _counts(c, [2] * len(c.slots)),
        adaptive_verification=True,
        admitted_drafts=_one_at(_counts(c, [0] * len(c.slots)), -1, r),
    ),
    "grammar.structured_output_request_ids:other=repeat": lambda c, r: replace(
        c, grammar_positions=[*range(len(c.slots)), 0]
    ),
    "grammar.grammar_bitmask:below=G * S - 1": lambda c, r: _grammar(
        c, max_num_logits_per_req=1, edits=["grammar-bitmask-short"]
    ),
    "grammar.grammar_bitmask:below=R - 1": lambda c, r: _grammar(c, edits=["grammar-bitmask-short"]),
    "grammar.grammar_bitmask:below=S = largest listed n_i - 1": lambda c, r: _grammar(
        _counts(c, _one_at(c, 3, r)), grammar_block_rows=2
    ),
    "grammar.num_acceptable_drafts:below=G - 1": lambda c, r: _grammar(
        c, num_acceptable_drafts=[0] * (len(c.slots) - 1)
    ),
    "grammar.num_acceptable_drafts:above=G + 1": lambda c, r: _grammar(
        c, num_acceptable_drafts=[0] * len(c.slots), edits=["acceptable-drafts-extra"]
    ),
    "local_output:other=None": lambda c, r: _explicit_outputs(c, drop_rank=True),
    "local_output.sampled_token_ids:above=n + 1": _edit("local-output-extra-row"),
    "local_output.num_sampled:below=n - 1": lambda c, r: _explicit_outputs(c, "num_sampled"),
    "local_output.num_rejected:below=n - 1": lambda c, r: _explicit_outputs(c, "num_rejected"),
    "local_output.num_nans:below=L_local - 1": lambda c, r: _explicit_outputs(c, "num_nans"),
    "local_output.logprobs_tensors:below=L_local - 1": lambda c, r: _explicit_outputs(c, "logprobs_tensors"),
    "local_output.sampled_token_ids:below=n - 1": lambda c, r: _explicit_outputs(c, "sampled_token_ids"),
    "local_output.num_sampled:above=n + 1": lambda c, r: _explicit_outputs(c, "num_sampled", by=1),
    "local_output.num_rejected:above=n + 1": lambda c, r: _explicit_outputs(c, "num_rejected", by=1),
    "local_output.num_nans:above=L_local + 1": lambda c, r: _explicit_outputs(c, "num_nans", by=1),
    "local_output.logprobs_tensors:above=L_local + 1": lambda c, r: _explicit_outputs(c, "logprobs_tensors", by=1),
    "batch.req_ids:above=num_reqs + 1": _edit("req-ids-long"),
    "batch.idx_mapping_np:above=num_reqs + 1": _edit("idx-mapping-np-long"),
    "batch.cu_num_logits_np:above=N + 2 entries": _edit("cu-logits-np-long"),
    "batch.seq_lens:above=N + 1": _edit("seq-lens-long"),
    "batch.seq_lens_cpu_upper_bound:above=N + 1": _edit("seq-lens-upper-bound-long"),
    "batch.seq_lens_cpu_upper_bound:other=None": _bound_absent,
    "batch.logits_indices:above=L + 1": _edit("logits-indices-long"),
    "batch.expanded_idx_mapping:above=L + 1": _edit("expanded-idx-mapping-long"),
    "batch.expanded_local_pos:above=L + 1": _edit("expanded-local-pos-long"),
    "grammar.grammar_bitmask:above=G * S + 1": lambda c, r: _grammar(
        c, max_num_logits_per_req=1, edits=["grammar-bitmask-long"]
    ),
    "grammar.grammar_bitmask:above=R + 1": lambda c, r: _grammar(c, edits=["grammar-bitmask-long"]),
    "logprobs_dims:below=k = -1": lambda c, r: replace(c, logprobs_dims=(-1, int(r.integers(0, 3)))),
    "logprobs_dims:below=t = -1": lambda c, r: replace(c, logprobs_dims=(int(r.integers(0, 3)), -1)),
    "logits_shard:above=L + 1": _edit("logits-shard-extra-row"),
    "local_output.extensions:other=undeclared": _edit("extension-undeclared"),
    "extension_fields:other=int16": lambda c, r: replace(
        c, extensions={"counts": {"per": "request", "dtype": "int16", "shape": []}}
    ),
    "batch.num_reqs:above=len(req_ids) + 1": _edit("num-reqs-plus-one"),
    "batch.idx_mapping_np:below=num_reqs - 1": _edit("idx-mapping-np-short"),
    "batch.idx_mapping_np:other=float64": _edit("idx-mapping-np-float64"),
    "batch.num_draft_tokens_per_req:other=float32": lambda c, r: replace(
        _counts(c, _one_at(c, 2, r)), edits=["draft-counts-float32"]
    ),
    "batch.cu_num_logits_np:below=N entries": _edit("cu-logits-np-short"),
    "batch.logits_indices:below=L - 1": _edit("logits-indices-short"),
    "batch.expanded_idx_mapping:below=L - 1": _edit("expanded-idx-mapping-short"),
    "batch.expanded_local_pos:below=L - 1": _edit("expanded-local-pos-short"),
    "grammar.structured_output_request_ids:other=unknown": lambda c, r: _grammar(c, edits=["grammar-id-unknown"]),
    "logits_shard:below=L - 1": _edit("logits-shard-short"),
    "logits_shard:other=int32": _edit("logits-shard-int32"),
    "owner_table:below=max_num_reqs - 1": _edit("owner-table-short"),
    "owner_table:above=max_num_reqs + 1": _edit("owner-table-long"),
    "owner_table:other=float64": _edit("owner-table-float64"),
    "owner_table:other=None": _edit("owner-table-absent"),
    "owner_table:below=-1": _edit("owner-table-negative"),
    "owner_table:above=tp": _edit("owner-table-past-tp"),
    "extension_fields:other=missing": lambda c, r: replace(
        c, extensions={"counts": {"per": "request", "dtype": "int32", "shape": []}}, edits=["extension-missing"]
    ),
}
