"""What a case draws of the input space (cases/input_space.py), measured from the case itself, and a
run's coverage: every variation of the space with how many valid steps drew it, and those none drew.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cache

from shardspec.conformance.cases.field_paths import (
    EXPLICIT_OUTPUTS,
    LOCAL_TENSORS,
    local_tensors,
    path_of_layout_name,
)
from shardspec.conformance.cases.input_space import (
    DIMS,
    DTYPE,
    FLOAT32_MAX,
    FLOAT32_SUBNORMAL,
    INT32,
    INT64,
    LARGE_BATCH,
    LAYOUT,
    LAYOUTS_1D,
    LAYOUTS_2D,
    PAIR,
    PRESENCE,
    VALUE,
    Variation,
    input_fields,
    input_space,
    pair_parts,
    pairs_left_out,
    raw_data_model,
)
from shardspec.conformance.cases.owner_tables import variants as owner_table_variants
from shardspec.conformance.cases.relations import relations as slot_relations
from shardspec.conformance.cases.sizes import sizes_drawn
from shardspec.conformance.cases.step_changes import step_variations
from shardspec.spec.case import case_owners, least_capacity, owner_table_of
from shardspec.spec.case_edits import LOGITS_LIMITS_EDIT, UPPER_BOUND_ABSENT
from shardspec.spec.layouts import BATCH_ARRAYS, BATCH_TENSORS
from shardspec.spec.rules import Rules

_DTYPE_EDITS = {
    "idx-mapping-np-int32": ("batch.idx_mapping_np", "int32"),
    "draft-counts-int64": (
        "batch.num_draft_tokens_per_req",
        "int64",
    ),
}


def float_limit(value: float) -> str | None:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    if abs(value) >= FLOAT32_MAX:
        return "largest" if value > 0 else "lowest"
    if value != 0 and abs(value) <= FLOAT32_SUBNORMAL * 1.5:
        return "subnormal"
    return None


def _int_limit(value: int, bounds: tuple[int, int]) -> str | None:
    return "dtype-min" if value <= bounds[0] else "dtype-max" if value >= bounds[1] else None


def _spec_decode(case) -> bool:
    return case.spec_decode is True or (case.spec_decode is None and any(n > 1 for n in case.num_logits_per_req))


def _owners(case) -> set[int]:
    return set(case_owners(case))


@cache
def declared_dtypes(rules: Rules) -> dict[str, tuple[str, ...]]:
    return {f.path: f.dtypes for f in input_fields(raw_data_model(), rules)}


@cache
def _two_dimensional(rules: Rules) -> frozenset[str]:
    """The fields a two-dimensional view applies to (the space gives them its two-dimensional layouts)."""
    return frozenset(v.field for v in input_space(rules) if v.axis == LAYOUT and v.value == LAYOUTS_2D[-1])


@cache
def _declared_values(rules: Rules) -> dict[str, dict]:
    return {f.path: dict(f.values) for f in input_fields(raw_data_model(), rules)}


def exercised(case, previous=None) -> set[Variation]:
    """The variations one step of ``case`` draws, read from the case (``previous``: the step before it
    on the same sharder, for the ``step`` axis). Only variations of the spec's input space count."""
    got: set[tuple[str, str, str]] = set()

    def add(path: str, axis: str, value: str) -> None:
        got.add((path, axis, value))

    slots, counts, cap, cap_logits = case.slots, case.num_logits_per_req, case.max_num_reqs, case.max_num_logits_per_req
    n_reqs = len(slots)
    idle = len(_owners(case)) < case.tp_size  # a rank owns nothing (at tp 1: an empty batch)
    spec_decode = _spec_decode(case)
    # value: ranges
    if n_reqs == 0:
        add("batch.num_reqs", VALUE, "min")
        for name in (
            "req_ids",
            "idx_mapping",
            "idx_mapping_np",
            "expanded_idx_mapping",
            "expanded_local_pos",
            "seq_lens",
            "logits_indices",
            "seq_lens_cpu_upper_bound",
            "num_draft_tokens_per_req",
            "num_admitted_draft_tokens",
        ):
            add(f"batch.{name}", DIMS, "empty")
        add("logits_shard", DIMS, "empty")
    rows = {t for tokens in case.sampled_tokens() for t in tokens}
    if rows & set(case.nan_tokens):
        add("logits_shard", VALUE, "nan")  # NaN in a few columns of those rows (spec/builders.py)
    if LOGITS_LIMITS_EDIT in case.edits and rows:
        # float32's limits; in float16 and bfloat16 the largest and lowest round to infinities and the
        # subnormal to 0, so those draw the infinities alone.
        for limit in ("+inf", "-inf", *(("largest", "lowest", "subnormal") if case.logits_dtype == "float32" else ())):
            add("logits_shard", VALUE, limit)
    if n_reqs == cap:
        add("batch.num_reqs", VALUE, "max")
    for relation in slot_relations(list(slots)):  # slots against batch positions (cases/relations.py)
        add("batch.idx_mapping", VALUE, relation)
    for name in ("idx_mapping", "idx_mapping_np", "expanded_idx_mapping"):
        if 0 in slots:
            add(f"batch.{name}", VALUE, "min")
        if cap - 1 in slots:
            add(f"batch.{name}", VALUE, "max")
    if counts:
        add("batch.expanded_local_pos", VALUE, "min")
        add("batch.cu_num_logits_np", VALUE, "min")
        if cap_logits in counts:
            add("batch.expanded_local_pos", VALUE, "max")
        if sum(counts) == cap * cap_logits:
            add("batch.cu_num_logits_np", VALUE, "max")
        if spec_decode:
            if 1 in counts:
                add("batch.num_draft_tokens_per_req", VALUE, "min")
            if cap_logits in counts:
                add("batch.num_draft_tokens_per_req", VALUE, "max")
    if case.admitted_drafts is not None and counts:
        if 0 in case.admitted_drafts:
            add("batch.num_admitted_draft_tokens", VALUE, "min")
        if any(a == c - 1 for a, c in zip(case.admitted_drafts, counts, strict=False)):
            add("batch.num_admitted_draft_tokens", VALUE, "max")
    if case.num_acceptable_drafts is not None and case.grammar_positions:
        acceptable = list(zip(case.num_acceptable_drafts, case.grammar_positions, strict=False))
        if any(a == 0 for a, _ in acceptable):
            add("grammar.num_acceptable_drafts", VALUE, "min")
        if any(p < len(counts) and a == counts[p] for a, p in acceptable):
            add("grammar.num_acceptable_drafts", VALUE, "max")
    if cap == least_capacity(case):  # 1, or tp where the profile needs a slot per rank (PRE-CAPACITY-TP)
        add("sharder.max_num_reqs", VALUE, "min")
    if cap_logits == 1:
        add("sharder.max_num_logits_per_req", VALUE, "min")
    add("sharder.adaptive_verification_enabled", VALUE, "true" if case.adaptive_verification else "false")
    add("gather_num_nans", VALUE, "true" if case.gather_num_nans else "false")
    if case.logprobs_dims is not None and 0 in case.logprobs_dims:
        add("logprobs_dims", VALUE, "min")
    # value: limits of the explicit outputs' values
    if isinstance(case.local_outputs, dict):
        declared = _declared_values(case.rules)
        for out in case.local_outputs.values():
            for name, path in EXPLICIT_OUTPUTS.items():
                values = getattr(out, name)
                flat = [v for row in values for v in row] if values and isinstance(values[0], list) else values or []
                low = declared.get(path, {}).get("min")
                for v in flat:
                    if isinstance(low, int) and v == low:
                        add(path, VALUE, "min")
                    if name == "logprobs":
                        limit = float_limit(float(v))
                    else:
                        limit = _int_limit(
                            int(v),
                            INT64
                            if name in ("sampled_token_ids", "logprob_token_ids", "selected_token_ranks")
                            else INT32,
                        )
                    if limit:
                        add(path, VALUE, limit)
    # dtype
    dtypes = {
        "batch.idx_mapping": "int64",
        "batch.idx_mapping_np": "intp",
        "batch.expanded_idx_mapping": "int32",
        "batch.expanded_local_pos": "int32",
        "batch.seq_lens": "int32",
        "batch.cu_num_logits": "int32",
        "batch.num_draft_tokens_per_req": "int32",
    }
    has_bound = case.rules.has_upper_bound
    upper_bound = has_bound and UPPER_BOUND_ABSENT not in case.edits
    if upper_bound:
        dtypes["batch.seq_lens_cpu_upper_bound"] = "int32"
    dtypes.update({f"batch.{name}": dtype for name, dtype in case.batch_dtypes.items() if f"batch.{name}" in dtypes})
    for edit in case.edits:
        if edit in _DTYPE_EDITS:
            path, dtype = _DTYPE_EDITS[edit]
            dtypes[path] = dtype
    if not spec_decode:
        dtypes.pop("batch.num_draft_tokens_per_req")
    for path, dtype in dtypes.items():
        add(path, DTYPE, dtype)
    add("logits_shard", DTYPE, case.logits_dtype)
    # layout
    # Every batch field a case may lay out (spec/layouts.py); the draft counts exist only with drafts.
    tensors = [
        "logits_shard",
        *(
            f"batch.{name}"
            for name in BATCH_TENSORS + BATCH_ARRAYS
            if spec_decode or name != "num_draft_tokens_per_req"
        ),
    ]
    if case.grammar_positions:
        tensors.append("grammar.grammar_bitmask")
    tensors += local_tensors(case)
    if upper_bound:
        tensors.append("batch.seq_lens_cpu_upper_bound")
    if case.admitted_drafts is not None:
        tensors.append("batch.num_admitted_draft_tokens")
    table = owner_table_of(case)
    if table is not None:
        tensors.append("owner_table")
        read = {table[s] for s in slots}
        if 0 in read:
            add("owner_table", VALUE, "min")
        if case.tp_size - 1 in read:
            add("owner_table", VALUE, "max")
        for variant in owner_table_variants(case):
            add("owner_table", VALUE, variant)
    viewed = {path: layout for name, layout in case.layouts.items() for path in path_of_layout_name(name)}
    two_d = _two_dimensional(case.rules)
    for path in tensors:
        layout = viewed.get(path, "contiguous")
        add(path, LAYOUT, "contiguous" if layout not in LAYOUTS_1D and path not in two_d else layout)
    # presence
    add("batch.num_draft_tokens_per_req", PRESENCE, "present" if spec_decode else "absent")
    if has_bound and not case.rules.upper_bound_required:  # optional: both presences
        add("batch.seq_lens_cpu_upper_bound", PRESENCE, "present" if upper_bound else "absent")
    add("batch.num_admitted_draft_tokens", PRESENCE, "absent" if case.admitted_drafts is None else "present")
    add("grammar", PRESENCE, "present" if case.grammar_positions else "absent")
    if case.grammar_positions:
        add("grammar.num_acceptable_drafts", PRESENCE, "absent" if case.num_acceptable_drafts is None else "present")
    add("logprobs_dims", PRESENCE, "absent" if case.logprobs_dims is None else "present")
    add("extension_fields", PRESENCE, "present" if case.extensions else "absent")
    add("local_output.extensions", PRESENCE, "present" if case.extensions else "absent")
    if case.extensions and n_reqs >= LARGE_BATCH:
        add("extension_fields", DIMS, "large")
        add("local_output.extensions", DIMS, "large")
    if case.local_outputs == "toy":
        if idle:
            for path in LOCAL_TENSORS:
                add(path, DIMS, "empty")
        add("local_output", PRESENCE, "present")
        add("local_output.logprobs_tensors", PRESENCE, "absent" if case.logprobs_dims is None else "present")
        add("local_output.num_nans", PRESENCE, "present")
    else:
        outputs = case.local_outputs
        add("local_output", PRESENCE, "present")
        if any(rank not in outputs for rank in range(case.tp_size)):
            add("local_output", PRESENCE, "absent")
        for out in outputs.values():
            add("local_output.logprobs_tensors", PRESENCE, "absent" if out.logprob_token_ids is None else "present")
            if out.logprob_token_ids is not None:  # the sampler's own prefix sums go with its logprobs
                for name in ("cu_num_generated_tokens", "cu_num_generated_tokens_tensor"):
                    presence = "absent" if getattr(out, name) is None else "present"
                    add(f"local_output.logprobs_tensors.{name}", PRESENCE, presence)
            add("local_output.num_nans", PRESENCE, "absent" if out.num_nans is None else "present")
    if previous is not None:
        got |= step_variations(previous, case)
    got |= sizes_drawn(case)
    space = set(input_space(case.rules))
    drawn = {Variation(*v) for v in got} & space
    return drawn | {v for v in space if v.axis == PAIR and set(pair_parts(v)) <= drawn}


def steps_of(cases: Iterable) -> list[tuple[object, object | None]]:
    """(step, the step before it on its sharder or None) for every step of ``cases``: multi-step cases
    are unrolled, and expanded steps (``continues``) are paired with the step they continue."""
    by_id, pairs = {}, []
    for case in cases:
        steps = [case, *case.then] if case.then else [case]
        for k, step in enumerate(steps):
            previous = steps[k - 1] if k else by_id.get(getattr(step, "continues", None))
            pairs.append((step, previous))
            by_id[step.case_id] = step
    return pairs


@dataclass
class Coverage:
    rules: Rules
    space: tuple[Variation, ...]
    counts: dict[Variation, int]

    @property
    def covered(self) -> list[Variation]:
        return [v for v in self.space if self.counts.get(v)]

    @property
    def not_covered(self) -> list[Variation]:
        return [v for v in self.space if not self.counts.get(v)]

    def as_dict(self) -> dict:
        return {
            "profile": self.rules.profile,
            "variations": len(self.space),
            "covered": len(self.covered),
            "not_covered": [v.key for v in self.not_covered],
            # Pairs the space leaves out on purpose, and why (cases/input_space.py).
            "left_out": dict(pairs_left_out(self.rules)),
            "counts": {v.key: self.counts.get(v, 0) for v in self.space},
        }


def coverage(cases: Iterable, rules: Rules) -> Coverage:
    """How often the valid steps of ``cases`` drew each variation of the input space (cases that
    violate a precondition on purpose do not count: they draw outside it)."""
    counts: dict[Variation, int] = {}
    for step, previous in steps_of(cases):
        if step.expect_error is not None:
            continue
        for variation in exercised(replace(step, rules=rules), previous):
            counts[variation] = counts.get(variation, 0) + 1
    return Coverage(rules, input_space(rules), counts)
