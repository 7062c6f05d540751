"""What one step of a sharder draws of the input space's ``step`` axis (cases/input_space.py): the fields that
changed since the step before on the same sharder, a step that repeats the one before, and the form in which
the engine carried the owner table across."""

from __future__ import annotations

from dataclasses import replace

from shardspec.conformance.cases.input_space import STEP
from shardspec.conformance.cases.owner_tables import carried_forms as owner_table_forms
from shardspec.spec.case import owner_table_of
from shardspec.spec.case_edits import UPPER_BOUND_ABSENT


def step_variations(previous, case) -> set[tuple[str, str, str]]:
    """(path, ``step``, value) for what ``case`` draws of the step axis after ``previous``."""
    changed = {
        "batch": (previous.slots, previous.num_logits_per_req, previous.seq_lens_growth)
        != (case.slots, case.num_logits_per_req, case.seq_lens_growth),
        "grammar": previous.grammar_positions != case.grammar_positions,
        "logits_shard": (previous.logits_dtype, previous.layouts.get("logits_shard"), previous.slots)
        != (case.logits_dtype, case.layouts.get("logits_shard"), case.slots),
        "local_output": previous.local_outputs != case.local_outputs or previous.slots != case.slots,
        "gather_num_nans": previous.gather_num_nans != case.gather_num_nans,
        "logprobs_dims": previous.logprobs_dims != case.logprobs_dims,
        "extension_fields": previous.extensions != case.extensions,
        "owner_table": owner_table_of(previous) != owner_table_of(case),
    }
    got = {(path, STEP, "changed") for path, differs in {**changed, **_loop_changes(previous, case)}.items() if differs}
    if _same_step(previous, case):
        got.add(("batch", STEP, "repeated"))
    return got | {("owner_table", STEP, form) for form in owner_table_forms(previous, case)}


def _loop_changes(previous, case) -> dict[str, bool]:
    """Which of LOOP_FIELDS moved between two steps of the same requests (none for other requests)."""
    if sorted(previous.slots) != sorted(case.slots):
        return {}

    def listed(step) -> list[int]:
        return [step.slots[p] for p in step.grammar_positions or []]

    def rows(step) -> dict[int, int]:
        return dict(zip(step.slots, step.num_logits_per_req, strict=True))

    def admitted(step) -> dict[int, int] | None:
        return None if step.admitted_drafts is None else dict(zip(step.slots, step.admitted_drafts, strict=True))

    reordered = previous.slots != case.slots
    # seq_lens follow the query lengths (the rows) and the tokens decoded (spec/builders.py), the bound seq_lens
    seq_lens = reordered or rows(previous) != rows(case) or previous.seq_lens_growth != case.seq_lens_growth
    bound = UPPER_BOUND_ABSENT not in previous.edits + case.edits
    came_or_went = (UPPER_BOUND_ABSENT in previous.edits) != (UPPER_BOUND_ABSENT in case.edits)
    return {
        "batch.seq_lens": seq_lens,
        "batch.seq_lens_cpu_upper_bound": (seq_lens and bound) or came_or_went,
        "batch.cu_num_logits": previous.num_logits_per_req != case.num_logits_per_req,
        "batch.num_admitted_draft_tokens": admitted(previous) != admitted(case),
        "batch.idx_mapping": reordered,
        "grammar.structured_output_request_ids": listed(previous) != listed(case),
    }


def _same_step(previous, case) -> bool:
    """The step before again: the same inputs but the logits (a step's seed draws its logits)."""

    def inputs(step):
        return replace(step, case_id="", description="", seed=0, continues=None, then=[])

    return inputs(previous) == inputs(case)
