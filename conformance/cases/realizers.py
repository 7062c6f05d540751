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

import numpy as np

from shardspec.conformance.cases import owner_tables
from shardspec.conformance.cases import relations as slot_relations
from shardspec.conformance.cases.coverage import (
    CU_GENERATED_TENSOR,
    EXPLICIT_OUTPUTS,
    LOCAL_TENSORS,
    declared_dtypes,
    exercised,
    float_limit,
    path_of_layout_name,
)
from shardspec.conformance.cases.input_space import (
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
    VALUE,
    Variation,
    input_space,
    pair_parts,
)
from shardspec.conformance.cases.sizes import SIZE_REALIZERS, largest_batch, with_logprobs
from shardspec.spec.case import least_capacity
from shardspec.spec.case_edits import LOGITS_LIMITS_EDIT, UPPER_BOUND_ABSENT
from shardspec.spec.model import DEFAULT_PROFILE
from shardspec.spec.profiles import rules_of


def _with_layout(layout: str, names: list[str]) -> Callable:
    def realize(case, rng):
        from shardspec.spec.layouts import LAYOUTS

        if layout not in LAYOUTS:
            return None  # a view the case format cannot make yet (spec/layouts.py)
        return replace(case, layouts={**case.layouts, **{name: layout for name in names}})

    return realize


def _batch_dtype(name: str, dtype: str) -> Callable:
    def realize(case, rng):
        if dtype not in declared_dtypes(case.profile).get(f"batch.{name}", ()):
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


_LOGPROB_NAMES = ("logprob_token_ids", "logprobs", "selected_token_ranks")


def _explicit_value(name: str, value) -> Callable:
    def realize(case, rng):
        if not isinstance(case.local_outputs, dict) or not case.local_outputs:
            return None
        if name in _LOGPROB_NAMES and case.logprobs_dims is None:
            case = replace(case, logprobs_dims=(1, 0))
        outputs = {}
        for rank, out in case.local_outputs.items():
            if name in _LOGPROB_NAMES:
                out = with_logprobs(case, rank, out)
            values = getattr(out, name)
            if values is None or not values:
                outputs[rank] = out
                continue
            copied = [list(row) for row in values] if isinstance(values[0], list) else list(values)
            # An entry no earlier change put at a limit, so that the variations drawn before stay drawn.
            if isinstance(copied[0], list):
                free = [(r, c) for r, row in enumerate(copied) for c, v in enumerate(row) if _plain(v)]
            else:
                free = [(r, None) for r, v in enumerate(copied) if _plain(v)]
            if free:
                row, col = free[int(rng.integers(len(free)))]
                if col is None:
                    copied[row] = value
                else:
                    copied[row][col] = value
            outputs[rank] = replace(out, **{name: copied})
        return replace(case, local_outputs=outputs)

    return realize


def _plain(value) -> bool:
    """Not at a limit a realizer puts a value at (a float's limits, an integer's dtype ends)."""
    if isinstance(value, float):
        return float_limit(value) is None
    return INT64[0] < value < INT32[1] and value != INT32[0]


# One extension field of each kind (CL-EXTENSION-FIELDS), as the sampling-mask example declares them.
EXTENSION = {"num_kept": {"per": "logits_row", "dtype": "int32", "shape": []}}


def _with_extension(case, rng):
    return replace(case, extensions={**case.extensions, **EXTENSION})


def _large_with_extension(case, rng):
    """The extension fields in a case of at least LARGE_BATCH requests (None for a smaller one: making it
    large would lose what it draws, and the generated cases hold large ones)."""
    return _with_extension(case, rng) if len(case.slots) >= LARGE_BATCH else None


# Capacities of a large batch: hundreds of requests, over a few 64-entry blocks.
LARGE_CAPACITIES = (128, 256, 512)


def as_large_batch(case, rng: np.random.Generator):
    """Hundreds of requests (half of the time exactly the capacity) over a small vocabulary, toy-sampled."""
    max_num_reqs = int(rng.choice(LARGE_CAPACITIES))
    num_reqs = int(rng.choice([LARGE_BATCH, max_num_reqs // 2 + 1, max_num_reqs, max_num_reqs]))
    max_logits = int(rng.integers(1, 5))
    slots = [int(s) for s in rng.choice(max_num_reqs, size=num_reqs, replace=False)]
    counts = [int(c) for c in rng.integers(1, max_logits + 1, size=num_reqs)]
    vocab_size = int(rng.choice([8, 33]))
    grammar = None
    if rng.random() < 0.5:
        grammar = [int(p) for p in rng.permutation(num_reqs)[: int(rng.integers(1, num_reqs + 1))]]
    return replace(
        case,
        slots=slots,
        num_logits_per_req=counts,
        max_num_reqs=max_num_reqs,
        max_num_logits_per_req=max_logits,
        spec_decode=None if max(counts) > 1 else case.spec_decode,
        grammar_positions=grammar,
        vocab_size=vocab_size,
        nan_tokens=sorted(int(t) for t in rng.choice(num_tokens(slots, counts), size=3, replace=False)),
        local_outputs="toy",
        # A drawn owner table is drawn again for the new slots (a table of the same kind would be kept
        # for slots the batch no longer has).
        owner_table=None
        if case.owner_table is None
        else owner_tables.draw_entries("mixed", slots, case.tp_size, max_num_reqs, rng),
    )


def num_tokens(slots: list[int], counts: list[int]) -> int:
    """The batch's scheduled tokens: build_input_batch's query lengths."""
    return sum(c + s % 3 for c, s in zip(counts, slots, strict=True))


def _capacity_one(case, rng):
    """A sharder of the smallest capacity (1, or tp where the profile needs a slot per rank,
    PRE-CAPACITY-TP): the batch is slot 0 or empty."""
    slots = [0] if case.slots else []
    return replace(
        case,
        max_num_reqs=least_capacity(case),
        slots=slots,
        num_logits_per_req=case.num_logits_per_req[:1],
        grammar_positions=[0] if case.grammar_positions and slots else None,
        num_acceptable_drafts=None,
        admitted_drafts=None if case.admitted_drafts is None else case.admitted_drafts[:1],
        nan_tokens=[],
        local_outputs="toy",
    )


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


def _without_nan_counts(case, rng):
    if not isinstance(case.local_outputs, dict) or not case.local_outputs:
        return None
    outputs = {rank: replace(out, num_nans=None) for rank, out in case.local_outputs.items()}
    return replace(case, gather_num_nans=False, local_outputs=outputs)


def _with_sampler_cu(name: str, layout: str | None = None) -> Callable:
    """The explicit outputs that carry logprobs also carry the sampler's own ``name`` (its local rows'
    prefix sums, which the gather does not read), the local output laid out as ``layout``."""

    def realize(case, rng):
        from shardspec.conformance.cases.strategies import local_requests  # strategies imports this module

        if not isinstance(case.local_outputs, dict) or (
            name.endswith("_tensor") and not rules_of(case.profile).adaptive
        ):
            return None
        outputs = dict(case.local_outputs)
        for rank, out in outputs.items():
            if out.logprob_token_ids is not None:
                rows = [case.num_logits_per_req[i] for i in local_requests(case, rank)]
                outputs[rank] = replace(out, **{name: [0, *np.cumsum(rows).tolist()]})
        if outputs == case.local_outputs:
            return None
        layouts = case.layouts if layout is None else {**case.layouts, "local_output": layout}
        return replace(case, local_outputs=outputs, layouts=layouts)

    return realize


def _no_local_output(case, rng):
    """An empty batch's rank passes no local output (tp 1: the one way its only rank owns nothing)."""
    if case.slots or case.local_outputs == {}:
        return None
    return replace(case, local_outputs={})


def _with_grammar(case, rng):
    """A grammar output listing about half of the requests, in a random order (none where there are none)."""
    if case.grammar_positions or not case.slots:
        return case if case.grammar_positions else None
    listed = [int(p) for p in rng.permutation(len(case.slots))[: max(1, len(case.slots) // 2)]]
    return replace(case, grammar_positions=listed, num_acceptable_drafts=None)


def _adaptive(case, rng):
    return replace(case, adaptive_verification=True) if rules_of(case.profile).adaptive else None


def _with_admitted_drafts(case, rng):
    """Adaptive verification with admitted counts below the scheduled ones (toy-sampled, with drafts)."""
    rules = rules_of(case.profile)
    if not (rules.adaptive and rules.admits_drafts) or case.local_outputs != "toy":
        return None
    if case.admitted_drafts is not None:
        return case
    if not any(c > 1 for c in case.num_logits_per_req):
        return None
    admitted = [int(rng.integers(0, c)) for c in case.num_logits_per_req]
    return replace(case, adaptive_verification=True, admitted_drafts=admitted)


def _with_upper_bound(case, rng):
    if not rules_of(case.profile).has_upper_bound:
        return None
    return replace(case, edits=[e for e in case.edits if e != UPPER_BOUND_ABSENT])


def _realizers() -> dict[str, Callable]:
    from shardspec.spec.layouts import (
        BATCH_ARRAYS,
        BATCH_TENSORS,
        FIELDS_2D,
        LAYOUTS,
        OWNER_TABLE,
        PROFILE_BATCH_FIELDS,
    )

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
    out["sharder.max_num_reqs:value=min"] = _capacity_one
    out["local_output.num_nans:presence=absent"] = _without_nan_counts
    out["local_output:presence=absent"] = _no_local_output
    for name in ("cu_num_generated_tokens", "cu_num_generated_tokens_tensor"):
        out[f"local_output.logprobs_tensors.{name}:presence=present"] = _with_sampler_cu(name)
    for layout in LAYOUTS_1D:
        out[f"{CU_GENERATED_TENSOR}:{LAYOUT}={layout}"] = _with_sampler_cu(
            "cu_num_generated_tokens_tensor", None if layout == "contiguous" else layout
        )
    limits = {
        "+inf": float("inf"),
        "-inf": float("-inf"),
        "nan": float("nan"),
        "largest": FLOAT32_MAX,
        "lowest": -FLOAT32_MAX,
        "subnormal": FLOAT32_SUBNORMAL,
    }
    for limit, value in limits.items():
        out[f"local_output.logprobs_tensors.logprobs:{VALUE}={limit}"] = _explicit_value("logprobs", value)
    for relation in slot_relations.RELATIONS:
        out[f"batch.idx_mapping:{VALUE}={relation}"] = slot_relations.realizer(relation)
    for variant in ("initial", "by-position", "mixed", "stale", "idle-rank"):
        out[f"{OWNER_TABLE}:{VALUE}={variant}"] = owner_tables.realizer(variant)
    for name, path in EXPLICIT_OUTPUTS.items():
        if name == "logprobs":
            continue
        bounds = INT64 if name in ("sampled_token_ids", "logprob_token_ids", "selected_token_ranks") else INT32
        out[f"{path}:{VALUE}=dtype-max"] = _explicit_value(name, bounds[1])
        if name in ("sampled_token_ids", "logprob_token_ids"):
            out[f"{path}:{VALUE}=dtype-min"] = _explicit_value(name, bounds[0])
        if name in ("num_sampled", "num_rejected", "selected_token_ranks"):
            out[f"{path}:{VALUE}=min"] = _explicit_value(name, 0)
    return out


REALIZERS: dict[str, Callable] = _realizers()


def realizable(profile: str = DEFAULT_PROFILE) -> list[Variation]:
    """The variations of the space that a case can be made to draw on purpose (a pair: both its parts)."""
    return [v for v in input_space(profile) if all(part.key in REALIZERS for part in _parts(v))]


def _parts(variation: Variation) -> tuple[Variation, ...]:
    return pair_parts(variation) if variation.axis == PAIR else (variation,)


def fill_gaps(cases: list, profile: str, rng) -> list:
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
    for variation in realizable(profile):
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
