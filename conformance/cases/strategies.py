"""Hypothesis strategies for valid cases, and seeded generation of a batch of them.

Every generated case satisfies the preconditions and looks like what engines
hand over: distinct slots in ``[0, max_num_reqs)``, 1..max_num_logits_per_req
logits rows per request (sometimes every request at the capacity), grammar
outputs listing a subset of the batch in any order, NaN tokens, logprobs dims
with ``max_token_ids`` sometimes above ``k``, logits in float32, bfloat16 or
float16, inputs passed as strided or storage-offset views (``Case.layouts``),
batches where some ranks own nothing, and either the toy sampler or explicit
per-rank outputs of random widths, some without logprobs and some with ids,
counts and logprobs at the limits of their dtypes.

Hypothesis draws a small batch (:func:`base_cases`); a numpy generator then
decides the case's kind (:func:`with_kind`): a share of the cases become
large batches (hundreds of requests, half of them exactly at the capacity,
over a small vocabulary: the Triton interpreter costs time per program), and
each case gets its logits dtype, its views and whether it uses explicit
outputs. In :func:`generate_cases` that generator is seeded by the run's seed,
the tp size and the case's number, so the shares hold in every run: hypothesis
favours small integers and values it drew before, which would leave them to
chance.

What may vary comes from the input space (cases/input_space.py, derived from
spec/data_model.yaml): the logits dtypes, the views, the float limits of the
logprob values. After the random draw, every variation of that space that no
case drew and a case can be made to draw is put into one of them
(realizers.fill_gaps), so the default run covers each at every tp size.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

try:  # a private module of hypothesis (see _without_local_constants); a version without it has no such hook
    from hypothesis.internal.conjecture import providers
except ImportError:
    providers = None

from shardspec.conformance.cases import input_space as space
from shardspec.conformance.cases import owner_tables, realizers
from shardspec.conformance.cases.batches import as_large_batch, local_requests, num_tokens
from shardspec.conformance.cases.profile_inputs import with_profile_inputs
from shardspec.spec.case import Case, ExplicitLocalOutput
from shardspec.spec.layouts import BATCH_ARRAYS, BATCH_TENSORS, LAYOUTS, LOCAL_OUTPUT
from shardspec.spec.profiles import default_rules
from shardspec.spec.rules import Rules

MAX_REQS_IN_BATCH = 12
MAX_LOGITS_PER_REQ = 8
LARGE_BATCH_SHARE = 0.1
EXPLICIT_OUTPUT_SHARE = 0.25
EXTREME_SHARE = 0.5  # of explicit outputs; then each value is at a limit with odds 1/4
INT32_MAX, INT64_MAX, INT64_MIN = 2**31 - 1, 2**63 - 1, -(2**63)
FLOAT32_LOWEST = -3.4028234663852886e38
# Token ids: the dtype's limits, and the first values past the vocabulary and past int32.
TOKEN_EXTREMES = (INT64_MAX, INT64_MIN, -1, INT32_MAX + 1)
# Logprob values: every float limit the input space gives the field (+-inf, NaN, the largest and
# lowest finite values, the smallest subnormal), and a logprob just below 0.
LOGPROB_FIELD = "local_output.logprobs_tensors.logprobs"
FLOAT_LIMIT_VALUES = {
    "+inf": float("inf"),
    "-inf": float("-inf"),
    "nan": float("nan"),
    "largest": space.FLOAT32_MAX,
    "lowest": FLOAT32_LOWEST,
    "subnormal": space.FLOAT32_SUBNORMAL,
}


def _field_values(path: str, axis: str, rules: Rules) -> list[str]:
    """The values of one axis the input space gives one field, in the data model's order."""
    return [v.value for v in space.input_space(rules) if v.field == path and v.axis == axis]


LOGPROB_EXTREMES = (
    *(FLOAT_LIMIT_VALUES[v] for v in _field_values(LOGPROB_FIELD, space.VALUE, default_rules())),
    -1e-45,
)
# The logits dtypes and the views the spec allows, from the input space (views the case format cannot
# make yet, spec/layouts.py, are left to the coverage report as not covered).
LOGITS_DTYPE_CHOICES = _field_values("logits_shard", space.DTYPE, default_rules())


@functools.cache
def view_choices(rules: Rules) -> list[str]:
    """The views the profile's callers pass (layouts rule): a case draws only those."""
    return [v for v in _field_values("batch.idx_mapping", space.LAYOUT, rules) if v in LAYOUTS and v != "contiguous"]


# Per-row NaN count whose sum over a request's rows still fits the gathered int32.
NAN_COUNT_EXTREME = INT32_MAX // MAX_LOGITS_PER_REQ


@st.composite
def base_cases(draw, tp_size: int, rules: Rules | None = None) -> tuple[Case, dict[int, ExplicitLocalOutput] | None]:
    """A small valid batch (toy sampler, float32, contiguous) and explicit outputs it may use instead, for
    the owners of the owner rule of ``rules`` (the default profile's if None)."""
    rules = rules or default_rules()
    max_num_reqs, max_logits, slots, counts = draw(_small_batch(tp_size))
    vocab_size = draw(st.sampled_from([8, 33, 100, 130, 257]))
    spec_decode = None if any(c > 1 for c in counts) else draw(st.sampled_from([None, True]))
    tokens = num_tokens(slots, counts)
    case = Case(
        case_id="generated",
        rules=rules,
        tp_size=tp_size,
        slots=slots,
        num_logits_per_req=counts,
        description="generated by hypothesis",
        max_num_reqs=max_num_reqs,
        max_num_logits_per_req=max_logits,
        spec_decode=spec_decode,
        grammar_positions=draw(_grammar_positions(len(slots))),
        vocab_size=vocab_size,
        seed=draw(st.integers(0, 2**16)),
        nan_tokens=draw(st.lists(st.integers(0, max(tokens - 1, 0)), unique=True, max_size=3)) if tokens else [],
        gather_num_nans=draw(st.booleans()),
        # The explicit outputs below are drawn for these dims; the kind may choose others (ranks' widths vary).
        logprobs_dims=draw(st.one_of(st.none(), st.tuples(st.integers(0, min(4, vocab_size)), st.integers(0, 6)))),
    )
    if rules.owner_by_table:
        # Drawn before the explicit outputs, which are written for the owners the table gives.
        kind = draw(st.sampled_from(owner_tables.KINDS))
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        case.owner_table = owner_tables.draw_entries(kind, slots, tp_size, max_num_reqs, rng)
    return case, draw(explicit_outputs(case)) if slots else None


@st.composite
def cases(draw, tp_size: int, case_id: str = "generated") -> Case:
    case, candidate = draw(base_cases(tp_size))
    return replace(with_kind(case, candidate, np.random.default_rng(draw(st.integers(0, 2**32 - 1)))), case_id=case_id)


def with_kind(case: Case, candidate, kind: np.random.Generator) -> Case:
    """``case`` as a large batch or with explicit outputs, in a logits dtype, with its views and logprobs dims."""
    if kind.random() < LARGE_BATCH_SHARE:
        case = as_large_batch(case, kind)
    elif candidate is not None and kind.random() < EXPLICIT_OUTPUT_SHARE:
        extreme = kind.random() < EXTREME_SHARE
        case = replace(
            case, local_outputs={rank: _with_extremes(out, kind) if extreme else out for rank, out in candidate.items()}
        )
    return replace(
        case,
        logits_dtype=str(kind.choice(LOGITS_DTYPE_CHOICES)),
        layouts=_layouts(case, kind),
        logprobs_dims=_logprobs_dims(case.vocab_size, kind),
    )


def _logprobs_dims(vocab_size: int, kind: np.random.Generator) -> tuple[int, int] | None:
    """None (no logprobs) in a quarter of the cases, else (k, t) with t above k about half of the time."""
    if kind.random() < 0.25:
        return None
    return int(kind.integers(0, min(4, vocab_size) + 1)), int(kind.integers(0, 7))


@st.composite
def _small_batch(draw, tp_size: int):
    """(max_num_reqs, max_num_logits_per_req, slots, counts) of at most MAX_REQS_IN_BATCH requests."""
    max_num_reqs = draw(st.sampled_from([max(tp_size, 8), 16, 64]))
    max_logits = draw(st.integers(1, MAX_LOGITS_PER_REQ))
    # Empty batches are one case among many, not a fifth of them.
    min_reqs = 0 if draw(st.integers(0, 19)) == 0 else 1
    if tp_size > 1 and draw(st.integers(0, 9)) == 0:
        # Every request on one rank: the others own nothing.
        owner = draw(st.integers(0, tp_size - 1))
        pool = st.integers(0, (max_num_reqs - 1 - owner) // tp_size).map(lambda k: owner + k * tp_size)
    else:
        pool = st.integers(0, max_num_reqs - 1)
    slots = draw(st.lists(pool, unique=True, min_size=min_reqs, max_size=min(max_num_reqs, MAX_REQS_IN_BATCH)))
    at_capacity = draw(st.integers(0, 4)) == 0
    count = st.just(max_logits) if at_capacity else st.integers(1, max_logits)
    counts = draw(st.lists(count, min_size=len(slots), max_size=len(slots)))
    return max_num_reqs, max_logits, slots, counts


def _layouts(case: Case, kind: np.random.Generator) -> dict[str, str]:
    """Contiguous inputs (a quarter of the cases), every input one view kind (a quarter), or a few views."""
    fields = [
        name
        for name in BATCH_TENSORS + BATCH_ARRAYS
        if name != "num_draft_tokens_per_req" or case.spec_decode is not False
    ]
    fields += ["logits_shard", LOCAL_OUTPUT] + (["grammar_bitmask"] if case.grammar_positions is not None else [])
    views = view_choices(case.rules)
    style = int(kind.integers(0, 4))
    if style == 0:
        return {}
    if style == 1:
        layout = str(kind.choice(views))
        return {name: layout for name in fields}
    chosen = kind.choice(fields, size=int(kind.integers(1, 5)), replace=False)
    return {str(name): str(kind.choice(views)) for name in chosen}


def _grammar_positions(num_reqs: int):
    if num_reqs == 0:
        return st.none()
    subset = st.permutations(list(range(num_reqs))).flatmap(
        lambda order: st.integers(1, num_reqs).map(lambda n: order[:n])
    )
    return st.one_of(st.none(), subset)


@st.composite
def explicit_outputs(draw, case: Case) -> dict[int, ExplicitLocalOutput]:
    """Per-rank outputs; ranks that own nothing are left out (they pass None)."""
    outputs = {}
    agreed_cols = None if case.logprobs_dims is None else 1 + max(case.logprobs_dims)
    for rank in range(case.tp_size):
        owned = local_requests(case, rank)
        if owned:
            outputs[rank] = draw(_rank_output(case, owned, agreed_cols))
    return outputs


@st.composite
def _rank_output(draw, case: Case, owned: list[int], agreed_cols: int | None) -> ExplicitLocalOutput:
    counts = [case.num_logits_per_req[i] for i in owned]
    num_rows = sum(counts)
    width = draw(st.integers(1, max(counts) + 1))  # narrower, equal or wider than the agreed width
    token = st.integers(0, case.vocab_size - 1)
    num_sampled = [draw(st.integers(1, c)) for c in counts]
    out = ExplicitLocalOutput(
        sampled_token_ids=[draw(st.lists(token, min_size=width, max_size=width)) for _ in owned],
        num_sampled=num_sampled,
        num_rejected=[c - s for c, s in zip(counts, num_sampled, strict=True)],
        num_nans=[draw(st.integers(0, 3)) for _ in range(num_rows)],
    )
    if agreed_cols is not None and draw(st.booleans()):
        cols = draw(st.integers(1, agreed_cols + 1))
        out.logprob_token_ids = [draw(st.lists(token, min_size=cols, max_size=cols)) for _ in range(num_rows)]
        logprob = st.floats(-20.0, 0.0, allow_nan=False, width=32)
        out.logprobs = [draw(st.lists(logprob, min_size=cols, max_size=cols)) for _ in range(num_rows)]
        out.selected_token_ranks = [draw(st.integers(0, 50)) for _ in range(num_rows)]
    return out


def _with_extremes(out: ExplicitLocalOutput, rng: np.random.Generator) -> ExplicitLocalOutput:
    """A copy with about a quarter of its values at the limits of their dtypes (the first id always)."""

    def some(values: list, extremes) -> list:
        return [extremes[int(rng.integers(len(extremes)))] if rng.random() < 0.25 else v for v in values]

    def rows(values, extremes):
        return None if values is None else [some(row, extremes) for row in values]

    ids = rows(out.sampled_token_ids, TOKEN_EXTREMES)
    ids[0][0] = INT64_MAX
    return ExplicitLocalOutput(
        sampled_token_ids=ids,
        num_sampled=some(out.num_sampled, (INT32_MAX,)),
        num_rejected=some(out.num_rejected, (INT32_MAX,)),
        num_nans=None if out.num_nans is None else some(out.num_nans, (NAN_COUNT_EXTREME,)),
        logprob_token_ids=rows(out.logprob_token_ids, TOKEN_EXTREMES),
        logprobs=rows(out.logprobs, LOGPROB_EXTREMES),
        selected_token_ranks=None if out.selected_token_ranks is None else some(out.selected_token_ranks, (INT64_MAX,)),
    )


@contextlib.contextmanager
def _without_local_constants():
    """Hypothesis (6.131 on) also draws constants it finds in the loaded modules of the code under test, so
    what it draws would depend on what the process imported before (a CLI run, a pytest worker after other
    tests): "same seed, same cases" needs them off. A private hook; where it is absent, there is none."""
    if providers is None:
        yield
        return
    hook = getattr(providers, "_get_local_constants", None)
    empty = getattr(providers, "Constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if hook is None or empty is None:
        yield
        return
    providers._get_local_constants = empty
    if cache is not None:
        cache.cache.clear()  # values cached from the local constants of earlier draws
    try:
        yield
    finally:
        providers._get_local_constants = hook
        if cache is not None:
            cache.cache.clear()


class _Enough(Exception):
    """Ends the drawing once ``count`` distinct cases are in: the rest of the budget would only be
    drawn and thrown away (most of the cost of generating)."""


def generate_cases(
    tp_size: int, count: int, seed: int, rules: Rules | None = None, fill_gaps: bool = True
) -> list[Case]:
    """``count`` distinct cases for ``tp_size`` (fewer only if hypothesis runs dry), the same for the same seed,
    under ``rules`` (the default profile's if None): vllm-0.33's cases are the seed profile's, a share of them
    with vLLM 0.33's inputs (cases/profile_inputs.py). With ``fill_gaps``, the variations of the input space the
    random draw missed are then made to appear (realizers.fill_gaps)."""
    rules = rules or default_rules()
    drawn: dict[str, Case] = {}

    # The budget stays count * 3 even though drawing stops early: hypothesis
    # adapts what it draws to the budget, and the cases must not change.
    @settings(
        max_examples=count * 3,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
    )
    @given(base_cases(tp_size, rules))
    def collect(drawn_base) -> None:
        if len(drawn) < count:
            kind = np.random.default_rng([seed, tp_size, len(drawn)])
            case = with_kind(*drawn_base, kind)
            drawn.setdefault(repr(case), case)
        if len(drawn) >= count:
            raise _Enough

    try:
        with _without_local_constants():
            hypothesis_seed(seed + tp_size)(collect)()
    except _Enough:
        pass
    unique = list(drawn.values())
    for number, case in enumerate(unique):
        case.case_id = f"gen-tp{tp_size}-s{seed}-{number:03d}"
    unique = [replace(case, rules=rules) for case in unique]
    unique = [
        with_profile_inputs(case, rules, np.random.default_rng([seed, tp_size, number, 33]))
        for number, case in enumerate(unique)
    ]
    # Then every variation of the input space that the random draw missed and a case can be made to
    # draw (conformance/cases/input_space.py), each in one case.
    return realizers.fill_gaps(unique, rules, np.random.default_rng([seed, tp_size, 23])) if fill_gaps else unique
