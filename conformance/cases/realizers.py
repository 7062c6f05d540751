"""Making a case draw a variation of the input space on purpose (cases/input_space.py says what the
space is and how what a case draws is measured).

:data:`REALIZERS` maps a variation's key to a change of a case that makes it draw that variation (None
where this case cannot: no requests, no explicit outputs). A variation without one can only be drawn
by chance or not at all, and stays listed as not covered. :func:`fill_gaps` puts every realizable
variation the random draw missed into some case of a run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from shardspec.conformance.cases import owner_tables
from shardspec.conformance.cases import relations as slot_relations
from shardspec.conformance.cases.batches import capacity_one
from shardspec.conformance.cases.coverage import declared_dtypes, exercised
from shardspec.conformance.cases.field_paths import (
    LOCAL_TENSORS,
    path_of_layout_name,
)
from shardspec.conformance.cases.input_space import (
    DTYPE,
    LARGE_BATCH,
    LAYOUT,
    LAYOUTS_1D,
    LAYOUTS_2D,
    PAIR,
    VALUE,
    Variation,
    input_space,
    pair_parts,
)
from shardspec.conformance.cases.output_realizers import OUTPUT_REALIZERS
from shardspec.conformance.cases.sizes import SIZE_REALIZERS, largest_batch
from shardspec.spec.case_edits import LOGITS_LIMITS_EDIT, UPPER_BOUND_ABSENT
from shardspec.spec.layouts import BATCH_ARRAYS, BATCH_TENSORS, FIELDS_2D, LAYOUTS, OWNER_TABLE, PROFILE_BATCH_FIELDS
from shardspec.spec.rules import Rules


def _with_layout(layout: str, names: list[str]) -> Callable:
    def realize(case, rng):
        if layout not in LAYOUTS:
            return None  # a view the case format cannot make yet (spec/layouts.py)
        return replace(case, layouts={**case.layouts, **{name: layout for name in names}})

    return realize


def _batch_dtype(name: str, dtype: str) -> Callable:
    def realize(case, rng):
        if dtype not in declared_dtypes(case.rules).get(f"batch.{name}", ()):
            return None
        if name == "seq_lens_cpu_upper_bound" and UPPER_BOUND_ABSENT in case.edits:
            return None  # no bound to pass in that dtype
        return replace(case, batch_dtypes={**case.batch_dtypes, name: dtype})

    return realize


def _slot(value: str) -> Callable:
    def realize(case, rng):
        if not case.slots:
            return None
        target = 0 if value == "min" else case.max_num_reqs - 1
        if target in case.slots:
            return case
        slots = list(case.slots)
        slots[int(rng.integers(len(slots)))] = target
        return replace(case, slots=slots)

    return realize


# One extension field of each kind (CL-EXTENSION-FIELDS), as the sampling-mask example declares them.
EXTENSION = {"num_kept": {"per": "logits_row", "dtype": "int32", "shape": []}}


def _with_extension(case, rng):
    return replace(case, extensions={**case.extensions, **EXTENSION})


def _large_with_extension(case, rng):
    """The extension fields in a case of at least LARGE_BATCH requests (None for a smaller one: making it
    large would lose what it draws, and the generated cases hold large ones)."""
    return _with_extension(case, rng) if len(case.slots) >= LARGE_BATCH else None


def _logits_limits(case, rng):
    """The logits-limits edit in float32 logits (the one dtype that holds every limit)."""
    if not case.slots:
        return None
    if LOGITS_LIMITS_EDIT in case.edits:
        return case if case.logits_dtype == "float32" else None
    return replace(case, edits=[*case.edits, LOGITS_LIMITS_EDIT], logits_dtype="float32")


def _nan_in_a_logits_row(case, rng):
    """The last token of a request whose rows are sampled: its logits row holds NaNs."""
    if not case.slots:
        return None
    ends = [tokens[-1] for tokens in case.sampled_tokens() if tokens]
    if not ends:
        return None
    return replace(case, nan_tokens=sorted({*case.nan_tokens, ends[int(rng.integers(len(ends)))]}))


def _with_grammar(case, rng):
    """A grammar output listing about half of the requests, in a random order (none where there are none)."""
    if case.grammar_positions or not case.slots:
        return case if case.grammar_positions else None
    listed = [int(p) for p in rng.permutation(len(case.slots))[: max(1, len(case.slots) // 2)]]
    return replace(case, grammar_positions=listed, num_acceptable_drafts=None)


def _adaptive(case, rng):
    return replace(case, adaptive_verification=True) if case.rules.adaptive else None


def _with_admitted_drafts(case, rng):
    """Adaptive verification with admitted counts below the scheduled ones (toy-sampled, with drafts)."""
    rules = case.rules
    if not (rules.adaptive and rules.admits_drafts) or case.local_outputs != "toy":
        return None
    if case.admitted_drafts is not None:
        return case
    if not any(c > 1 for c in case.num_logits_per_req):
        return None
    admitted = [int(rng.integers(0, c)) for c in case.num_logits_per_req]
    return replace(case, adaptive_verification=True, admitted_drafts=admitted)


def _with_upper_bound(case, rng):
    if not case.rules.has_upper_bound:
        return None
    return replace(case, edits=[e for e in case.edits if e != UPPER_BOUND_ABSENT])


def _realizers() -> dict[str, Callable]:
    out: dict[str, Callable] = {}
    viewed = BATCH_TENSORS + BATCH_ARRAYS + PROFILE_BATCH_FIELDS + ("grammar_bitmask", "logits_shard", OWNER_TABLE)
    for name in viewed:
        # The views the case format makes, of as many dimensions as the field has.
        for layout in (v for v in (LAYOUTS_2D if name in FIELDS_2D else LAYOUTS_1D) if v in LAYOUTS):
            for path in path_of_layout_name(name):
                out[f"{path}:{LAYOUT}={layout}"] = _with_layout(layout, [name])
    for layout in (v for v in LAYOUTS_2D if v in LAYOUTS):
        for path in LOCAL_TENSORS:  # a two-dimensional view leaves a local output's 1-D tensors as they are
            out[f"{path}:{LAYOUT}={layout}"] = _with_layout(layout, ["local_output"])
    for name, dtypes in (
        ("idx_mapping", ("int32", "int64")),
        ("expanded_idx_mapping", ("int32", "int64")),
        ("expanded_local_pos", ("int32", "int64")),
        ("seq_lens", ("int32", "int64")),
        ("cu_num_logits", ("int32", "int64")),
        ("seq_lens_cpu_upper_bound", ("int32", "int64")),
    ):
        for dtype in dtypes:
            out[f"batch.{name}:{DTYPE}={dtype}"] = _batch_dtype(name, dtype)
    out["batch.idx_mapping_np:dtype=int32"] = lambda c, r: replace(c, edits=[*c.edits, "idx-mapping-np-int32"])
    out["batch.num_draft_tokens_per_req:dtype=int64"] = lambda c, r: (
        replace(c, spec_decode=True, edits=[*c.edits, "draft-counts-int64"]) if c.slots else None
    )
    for dtype in ("float32", "bfloat16", "float16"):
        out[f"logits_shard:{DTYPE}={dtype}"] = lambda c, r, d=dtype: replace(c, logits_dtype=d)
    for name in ("idx_mapping", "idx_mapping_np", "expanded_idx_mapping"):
        for value in ("min", "max"):
            out[f"batch.{name}:{VALUE}={value}"] = _slot(value)
    out["batch.num_draft_tokens_per_req:presence=present"] = lambda c, r: (
        replace(c, spec_decode=True) if c.slots else None
    )
    out["batch.seq_lens_cpu_upper_bound:presence=absent"] = lambda c, r: replace(
        c,
        edits=[*c.edits, UPPER_BOUND_ABSENT],
        layouts={k: v for k, v in c.layouts.items() if k != "seq_lens_cpu_upper_bound"},
        batch_dtypes={k: v for k, v in c.batch_dtypes.items() if k != "seq_lens_cpu_upper_bound"},
    )
    for limit in ("+inf", "-inf", "largest", "lowest", "subnormal"):
        out[f"logits_shard:{VALUE}={limit}"] = _logits_limits
    out["logits_shard:value=nan"] = _nan_in_a_logits_row
    out["batch.cu_num_logits_np:value=max"] = largest_batch
    out.update(SIZE_REALIZERS)
    out["logprobs_dims:value=min"] = lambda c, r: replace(c, logprobs_dims=(0, int(r.integers(0, 4))))
    out["gather_num_nans:value=true"] = lambda c, r: replace(c, gather_num_nans=True)
    out["gather_num_nans:value=false"] = lambda c, r: replace(c, gather_num_nans=False)
    out["extension_fields:presence=present"] = _with_extension
    out["grammar:presence=present"] = _with_grammar
    out["logprobs_dims:presence=present"] = lambda c, r: c if c.logprobs_dims else replace(c, logprobs_dims=(1, 2))
    out["sharder.adaptive_verification_enabled:value=true"] = _adaptive
    out["batch.num_admitted_draft_tokens:presence=present"] = _with_admitted_drafts
    out["batch.seq_lens_cpu_upper_bound:presence=present"] = _with_upper_bound
    out["local_output.extensions:presence=present"] = _with_extension
    out["extension_fields:dims=large"] = _large_with_extension
    out["local_output.extensions:dims=large"] = _large_with_extension
    out["sharder.max_num_reqs:value=min"] = capacity_one
    out.update(OUTPUT_REALIZERS)
    for relation in slot_relations.RELATIONS:
        out[f"batch.idx_mapping:{VALUE}={relation}"] = slot_relations.realizer(relation)
    for variant in ("initial", "by-position", "mixed", "stale", "idle-rank"):
        out[f"{OWNER_TABLE}:{VALUE}={variant}"] = owner_tables.realizer(variant)
    return out


REALIZERS: dict[str, Callable] = _realizers()


def realizable(rules: Rules) -> list[Variation]:
    """The variations of the space that a case can be made to draw on purpose (a pair: both its parts)."""
    return [v for v in input_space(rules) if all(part.key in REALIZERS for part in _parts(v))]


def _parts(variation: Variation) -> tuple[Variation, ...]:
    return pair_parts(variation) if variation.axis == PAIR else (variation,)


def fill_gaps(cases: list, rules: Rules, rng) -> list:
    """``cases`` with every realizable variation that none of them draws made to appear in one of
    them: a covering selection on top of the random draw. Each change is kept only where the changed
    case then draws the variation and those made to appear in it before, and loses nothing that no
    other case draws (measured, not assumed); a case may take several."""
    cases = list(cases)
    if not cases:
        return cases
    draws = [exercised(c) for c in cases]
    counts = Counter(v for drawn in draws for v in drawn)  # variation -> cases drawing it
    forced: dict[int, set[Variation]] = {}
    for variation in realizable(rules):
        if counts[variation]:
            continue
        for index in _candidates(cases, forced, rng):
            changed = realize(cases[index], variation, rng)
            if changed is None:
                continue
            now = exercised(changed)
            lost_alone = {v for v in draws[index] - now if counts[v] == 1}
            if now >= forced.get(index, set()) | {variation} and not lost_alone:
                counts.subtract(draws[index])
                counts.update(now)
                cases[index], draws[index] = changed, now
                forced.setdefault(index, set()).add(variation)
                break
    return cases


def _candidates(cases: list, forced: dict[int, set], rng) -> list[int]:
    """The cases to try a variation in: toy-sampled ones already changed first, so that what is made to appear
    gathers in few cases (a run that judges some of the pool draws it all with fewer), then the rest in a
    random order (cases with explicit outputs are few, and many variations need one of their own)."""
    order = [int(i) for i in rng.permutation(len(cases))]
    return sorted(order, key=lambda i: not (i in forced and cases[i].local_outputs == "toy"))


def realize(case, variation: Variation, rng):
    """``case`` changed so that it draws ``variation``, or None where this case cannot (no requests,
    no explicit outputs, a view the case format cannot make)."""
    # A pair's dtype last: the logits-limits realizer picks float32 logits, which a float16 pair then changes.
    for part in reversed(_parts(variation)):
        realizer = REALIZERS.get(part.key)
        case = None if realizer is None or case is None else realizer(case, rng)
    # A realizer that moved a request onto a slot holding a stale owner would make the case invalid.
    return None if case is None else owner_tables.without_stale_reads(case)
