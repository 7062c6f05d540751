"""The input space is derived from the spec, generated cases draw it, every precondition is violated at
every boundary it states, and the new inputs catch defects the old generators let pass."""

import copy
import pathlib

import pytest

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.broken import BY_NAME
from shardspec.conformance.broken import cases as targeted
from shardspec.conformance.cases import boundaries as bounds
from shardspec.conformance.cases import coverage, realizers, sizes
from shardspec.conformance.cases import input_space as space
from shardspec.conformance.cases.strategies import generate_cases
from shardspec.conformance.replay import run_case_in_process
from shardspec.fixtures import load_cases
from shardspec.fixtures.catalogue import with_profile
from shardspec.spec.guarantees import broken_guarantee
from shardspec.spec.loader import load_spec
from shardspec.spec.profiles import DEFAULT_PROFILE, PROFILES, load_profile_file, rules_of

NEW_FIELD = {
    "name": "engine_temperatures",
    "type": "tensor",
    "dtype": "float32",
    "shape": ["N"],
    "placement": "device",
    "optional": True,
    "meaning": "A field a later spec might add.",
    "values": {"min": 0, "limits": True},
    "dtypes": ["float32", "bfloat16"],
}


# A profile whose callers send every dtype the data model accepts (dtypes: accepted), and one whose callers
# send the engine's own (dtypes: engine): the space's dtypes follow the profile (spec/guarantees.py).
EVERY_DTYPE, ENGINE_DTYPES = "vllm-0.34-strict", "vllm-0.34"


def test_a_field_added_to_the_data_model_gets_its_variations():
    model = copy.deepcopy(space.raw_data_model())
    before = {v.key for v in space.derive(model, rules_of(EVERY_DTYPE))}
    next(t for t in model["types"] if t["name"] == "InputBatch")["fields"].append(NEW_FIELD)
    added = {v.key for v in space.derive(model, rules_of(EVERY_DTYPE))} - before
    path = "batch.engine_temperatures"
    want = {f"{path}:value={v}" for v in ("min", *space.FLOAT_LIMITS)}
    want |= {f"{path}:dtype=float32", f"{path}:dtype=bfloat16", f"{path}:presence=present", f"{path}:presence=absent"}
    want |= {f"{path}:layout={layout}" for layout in space.LAYOUTS_1D} | {f"{path}:dims=empty"}
    # Each dtype with each limit (bfloat16 without float32's finite limits) and each non-contiguous layout.
    limits = {"float32": space.FLOAT_LIMITS, "bfloat16": ("+inf", "-inf", "nan")}
    want |= {f"{path}:pair=dtype={d},value={v}" for d, values in limits.items() for v in values}
    want |= {f"{path}:pair=dtype={d},layout={layout}" for d in limits for layout in ("strided", "offset")}
    # A batch field's dtype other than its default, with each optional output.
    outputs = ("logprobs_dims:presence=present", "grammar:presence=present", "extension_fields:presence=present")
    want |= {f"{path}+{o.split(':')[0]}:pair=dtype=bfloat16,{o.split(':')[1]}" for o in outputs}
    want |= {f"{path}+gather_num_nans:pair=dtype=bfloat16,value=true"}
    assert added == want


def test_a_batch_field_s_dtypes_are_those_the_profile_s_callers_send():
    for profile, sent in ((EVERY_DTYPE, ("int32", "int64")), (ENGINE_DTYPES, ())):
        keys = {v.key for v in space.input_space(rules_of(profile))}
        for name in ("idx_mapping", "seq_lens", "cu_num_logits", "seq_lens_cpu_upper_bound"):
            assert {d for d in ("int32", "int64") if f"batch.{name}:dtype={d}" in keys} == set(sent), (profile, name)
    # the engine's own dtype where it is not the data model's default (expanded_idx_mapping: engine_dtype int64)
    assert "batch.expanded_idx_mapping:dtype=int64" in {v.key for v in space.input_space(rules_of(ENGINE_DTYPES))}
    for case in generate_cases(2, 30, 0, rules_of(ENGINE_DTYPES)):
        breach = broken_guarantee(case, rules_of(ENGINE_DTYPES))
        assert breach is None or breach.rule != "dtypes", (case.case_id, str(breach))


def test_each_profile_field_meets_each_optional_output():
    keys = {v.key for v in space.input_space(rules_of(EVERY_DTYPE))}
    outputs = [f"{f}:{a}={v}" for f, a, v in space.OPTIONAL_OUTPUTS]
    # vllm-0.33 always passes the bound (seq_lens_upper_bound: always): it is no optional part there, and
    # every case draws it with whatever output it has; where it is optional (the guide's engine profile),
    # both its presences meet each output.
    bound = [f"{f}:{a}={v}" for f, a, v in space.PROFILE_PARTS if f == "batch.seq_lens_cpu_upper_bound"]
    assert not [k for k in keys if k.startswith("batch.seq_lens_cpu_upper_bound:presence")]
    optional = {v.key for v in space.input_space(rules_of(load_profile_file(ENGINE_PROFILE).name))}
    for part in bound:
        for output in outputs:
            if output not in optional:  # an output the engine's callers never ask for (extension_fields: none)
                continue
            pair = space.cross_pair(space.Variation(*_split(part)), space.Variation(*_split(output)))
            assert pair.key in optional, pair.key
    parts = [f"{f}:{a}={v}" for f, a, v in space.PROFILE_PARTS if f"{f}:{a}={v}" not in bound]
    parts += ["batch.idx_mapping:dtype=int32"]
    parts += [f"batch.{name}:dtype=int64" for name in ("expanded_idx_mapping", "expanded_local_pos", "seq_lens")]
    for part in parts:
        for output in outputs:
            pair = space.cross_pair(space.Variation(*_split(part)), space.Variation(*_split(output)))
            assert pair.key in keys, pair.key
            assert [p.key for p in space.pair_parts(pair)] == [part, output]
    assert not [k for k in {v.key for v in space.input_space(rules_of("vllm-seed"))} if "admitted" in k and "+" in k]


def _split(key: str) -> tuple[str, str, str]:
    field, rest = key.split(":", 1)
    return (field, *rest.split("=", 1))


def test_a_pair_names_its_two_parts():
    pair = space.pair("logits_shard", ("dtype", "float16"), ("value", "+inf"))
    assert pair.key == "logits_shard:pair=dtype=float16,value=+inf"
    assert [p.key for p in space.pair_parts(pair)] == ["logits_shard:dtype=float16", "logits_shard:value=+inf"]


def test_the_spec_s_fields_get_their_variations():
    keys = {v.key for v in space.input_space(rules_of(EVERY_DTYPE))}
    assert {"batch.idx_mapping:value=min", "batch.idx_mapping:value=max", "batch.idx_mapping:dtype=int32"} <= keys
    assert {"logits_shard:value=+inf", "logits_shard:value=nan", "logits_shard:layout=row-padded"} <= keys
    assert {"grammar:presence=absent", "logprobs_dims:step=changed", "batch.num_reqs:value=min"} <= keys
    # The sharder's construction parameters never change between steps; what shard returned is no input.
    assert not [k for k in keys if k.startswith(("sharder:", "metadata", "local_batch", "global_batch"))]
    assert "batch.seq_lens_cpu_upper_bound:presence=absent" not in {
        v.key for v in space.input_space(rules_of("vllm-seed"))
    }


def test_every_size_of_the_data_model_has_its_empty_and_largest_value_or_says_why_not():
    model = space.raw_data_model()
    assert sizes.sizes_without_ends(model) == []
    symbols = {s["name"] for s in model["symbols"]}
    assert set(sizes.SIZES) - symbols == {"batch.num_draft_tokens", "extension_fields"}  # counts, not symbols
    keys = {v.key for v in space.input_space(rules_of(EVERY_DTYPE))}  # extension fields' sizes too
    for name, size in sizes.SIZES.items():
        assert (f"{name}:size=empty" in keys) == (size.empty is not None), name
        assert (f"{name}:size=largest" in keys) == (size.largest is not None), name
    both = {"N", "L", "n", "L_local", "G", "k", "t", "w", "c", "E", "extension_fields"}
    assert both <= {n for n, s in sizes.SIZES.items() if s.empty and s.largest}


def test_a_size_added_to_the_data_model_is_named_until_it_has_its_ends():
    model = copy.deepcopy(space.raw_data_model())
    model["symbols"].append({"name": "Z9", "meaning": "a size a later spec might add"})
    assert sizes.sizes_without_ends(model) == ["Z9"]


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8])
def test_default_generated_cases_draw_every_realizable_variation(tp):
    cases = generate_cases(tp, 100, 0)
    cov = coverage.coverage(cases, rules_of(DEFAULT_PROFILE))
    missed = {v.key for v in cov.not_covered} & {v.key for v in realizers.realizable(rules_of(DEFAULT_PROFILE))}
    assert not missed
    for case in cases:  # still valid inputs
        assert case.expect_error is None and len(set(case.slots)) == len(case.slots)
        assert all(0 <= s < case.max_num_reqs for s in case.slots)


# Boundaries the case format cannot express yet (each needs a named edit in spec/case_edits.py, a
# layout in spec/layouts.py or a builder option): listed so that the test fails when one appears or goes.
KNOWN_GAPS: set[tuple[str, str]] = set()


@pytest.mark.parametrize("profile", PROFILES)
def test_every_precondition_is_violated_at_every_boundary_and_tp(profile):
    found = bounds.boundaries(rules_of(profile))
    for pre in load_spec(profile=profile).preconditions:
        if not pre.must_reject:
            continue
        named = {f for b in found if b.pre == pre.id for f in b.fields}
        assert set(pre.fields) <= named, f"{pre.id}: fields without a boundary: {sorted(set(pre.fields) - named)}"
    assert {(b.pre, b.key) for b in bounds.missing(rules_of(profile))} == KNOWN_GAPS - _not_in(profile)
    made = {}
    for case in bounds.boundary_cases(rules_of(profile)):
        made.setdefault(case.case_id, case)
    assert len(made) == len(bounds.boundary_cases(rules_of(profile))), "case ids are unique"
    for b in found:
        if b.key not in bounds.REALIZERS:
            continue
        sizes = [tp for tp in bounds.TP_SIZES if bounds.applies_at(b, tp, rules_of(profile))]
        assert sizes, f"{b.pre} at {b.key}: no group size can break it"
        for tp in sizes:  # under a profile that builds no sharder of one rank, tp 1 has PRE-TP-SIZE only
            case = made.get(f"tp{tp}-reject-{b.pre.removeprefix('PRE-').lower()}-at-{b.slug}")
            assert case is not None and case.expect_error == b.pre, (b, tp)
            idle = set(range(tp)) - {s % tp for s in case.slots}
            # More requests than a capacity of at least tp slots (PRE-CAPACITY-TP) leave no rank idle.
            crowded = len(case.slots) > case.max_num_reqs >= tp > 1 and rules_of(profile).sharded_groups_only
            if b.raised_on == "every rank" and tp > 1 and not crowded:
                assert idle, f"{case.case_id}: a replicated precondition is also rejected by ranks that own nothing"
            elif b.raised_on != "every rank":
                assert not idle, f"{case.case_id}: every rank is faulty"


@pytest.mark.parametrize("profile", PROFILES)
def test_every_length_is_violated_one_short_and_one_long(profile):
    assert bounds.one_sided(bounds.boundaries(rules_of(profile))) == []


def test_a_length_violated_on_one_side_only_is_named():
    def boundary(field, side, value):
        return bounds.Boundary("PRE-X", (field,), side, value, "every rank", ())

    found = [
        boundary("batch.seq_lens", "below", "N - 1"),
        boundary("logits_shard", "above", "L + 1"),
        boundary("batch.cu_num_logits_np", "below", "N entries"),
        boundary("batch.num_reqs", "above", "max_num_reqs + 1"),  # a range's one stated side, not a length
        boundary("sharder.max_num_reqs", "below", "num_reqs - 1"),  # a capacity below the batch
        boundary("local_output.num_nans", "below", "L_local - 1"),
        boundary("local_output.num_nans", "above", "L_local + 1"),
    ]
    assert bounds.one_sided(found) == [
        ("PRE-X", "batch.cu_num_logits_np", "N + 2 entries"),
        ("PRE-X", "batch.seq_lens", "N + 1"),
        ("PRE-X", "logits_shard", "L - 1"),
    ]


@pytest.mark.parametrize("seed", [0, 3])
def test_a_run_checks_every_boundary_once(seed):
    for profile in PROFILES:
        per_tp = [bounds.boundary_cases_for_run(tp, rules_of(profile), seed) for tp in bounds.TP_SIZES]
        ids = [c.case_id.split("-reject-", 1)[1] for cases in per_tp for c in cases]
        realizable = [b for b in bounds.boundaries(rules_of(profile)) if b.key in bounds.REALIZERS]
        assert sorted(ids) == sorted(f"{b.pre.removeprefix('PRE-').lower()}-at-{b.slug}" for b in realizable)
        assert all(c.tp_size == tp for tp, cases in zip(bounds.TP_SIZES, per_tp, strict=True) for c in cases)


def _not_in(profile):
    return {(pre, key) for pre, key in KNOWN_GAPS if pre not in {b.pre for b in bounds.boundaries(rules_of(profile))}}


@pytest.mark.parametrize("profile", PROFILES)
def test_the_reference_rejects_every_boundary_case(profile):
    for case in bounds.boundary_cases(rules_of(profile), tp_sizes=(3,)):
        result = run_case_in_process(case, ImplChoice("reference"))
        assert result.status == "pass", (case.case_id, result.violations[:2], result.errors)


# Each new entry, the inputs of the old generators it passed (the reject fixtures, the targeted cases).
OLD_INPUTS = {
    "negative-slots-accepted": ["tp2-error-slot-range", "tp4-reject-slot-range", "tp8-reject-slot-range"],
    "idle-ranks-check-nothing": ["tp4-reject-capacity-logits", "tp8-reject-slot-range", "tp3-reject-logprobs-dims"],
    "logprobs-clamped-at-zero": ["explicit-widths", "explicit-narrow-logprobs", "decode"],
    "logprob-nans-as-minus-inf": ["explicit-widths", "explicit-narrow-logprobs", "decode"],
    "logprobs-dims-of-first-step": ["multi-step", "decode"],
    "upper-bound-unit-stride": ["adaptive-admitted-no-counts", "strided-inputs", "offset-inputs", "admitted-drafts"],
    "admitted-from-buffer-start": ["adaptive-admitted-no-counts", "adaptive-budget-zero", "admitted-drafts"],
    "logits-rows-packed": ["spec", "strided-inputs", "offset-inputs", "decode-bf16"],
    "grammar-rows-packed": ["grammar", "strided-inputs", "offset-inputs", "grammar-one-rank"],
    "local-logprobs-rows-packed": ["spec", "strided-local-output", "explicit-widths", "decode"],
    "logits-clamped-to-half-range": ["decode", "spec", "strided-inputs", "decode-bf16", "grammar"],
    "host-slots-of-any-dtype": ["tp2-error-slot-range", "tp4-reject-slot-range", "decode", "spec"],
    "upper-bound-made-up": ["decode", "strided-inputs", "spec", "grammar"],
    "sampler-prefix-sums-passed-on": ["spec", "explicit-widths", "strided-local-output", "logprob-plus-inf"],
    "lengths-checked-from-below-only": ["seq-lens-one-short", "logits-indices-one-short", "decode", "spec"],
    # a later step's profile inputs (multi-step cases drew the seed profile's before) and the sizes' ends
    "local-drafts-cached-by-scheduled-drafts": ["multi-step", "decode-loop", "adaptive-admitted-no-counts"],
    "local-idx-mapping-in-first-steps-dtype": ["multi-step", "decode-loop", "adaptive-admitted-no-counts"],
    "grammar-listing-nothing-handed-on": ["grammar", "grammar-one-rank", "adaptive-admitted-no-counts", "empty"],
    "logprob-columns-staged-in-fixed-buffer": ["spec", "token-ids-wider", "explicit-widths", "large-batch"],
    # the ends of the extension fields' count, of an entry's shape E and of the local widths w and c
    "extensions-none-when-none-declared": ["decode", "extensions", "tp2-extensions", "empty"],
    "extension-fields-in-fixed-table": ["extensions", "extensions-many-requests", "tp2-extensions", "tp8-extensions"],
    "extension-entries-staged-in-fixed-buffer": ["extensions", "tp2-extensions", "adaptive-admitted-extensions"],
    "zero-width-ids-taken-for-an-idle-rank": ["explicit-widths", "token-ids-wider", "decode", "empty"],
    "local-ids-skipped-past-fixed-buffer": ["explicit-widths", "token-ids-wider", "explicit-narrow-logprobs"],
    "zero-width-logprobs-taken-for-none": ["explicit-widths", "explicit-narrow-logprobs", "explicit-missing-logprobs"],
    "grammar-dropped-without-upper-bound": [
        "grammar",
        "adaptive-admitted-no-counts",
        "seq-lens-cpu-upper-bound-absent",
    ],
}


# Entries whose defect no bundled profile can show, and the profile file they run under: a bound made up
# where the batch has none needs seq_lens_upper_bound: optional (the guide's engine profile).
ENGINE_PROFILE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "engine_profile" / "engine.yaml"
OWN_PROFILE = {"upper-bound-made-up": ENGINE_PROFILE, "grammar-dropped-without-upper-bound": ENGINE_PROFILE}


@pytest.mark.parametrize("name", sorted(OLD_INPUTS))
def test_new_inputs_catch_what_the_old_ones_let_pass(name):
    entry = BY_NAME[name]
    profile = load_profile_file(OWN_PROFILE[name]).name if name in OWN_PROFILE else None
    assert profile or entry.profiles, f"{name} runs under no profile"
    under = (lambda case: with_profile(case, rules_of(profile))) if profile else (lambda case: case)
    fixtures = {c.case_id: c for c in load_cases()}
    for case_id in OLD_INPUTS[name]:
        case = under(targeted.BY_ID.get(case_id) or fixtures[case_id])
        result = run_case_in_process(case, ImplChoice(entry.target))
        assert (result.errors, result.violations) == ([], []), f"{name} on {case_id}"
    for case_id in entry.cases:
        result = run_case_in_process(under(targeted.BY_ID[case_id]), ImplChoice(entry.target))
        assert entry.invariant_id in {v["invariant_id"] for v in result.violations}, (name, case_id)
        assert run_case_in_process(under(targeted.BY_ID[case_id]), ImplChoice("reference")).status == "pass"
