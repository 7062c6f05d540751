"""The data model is the one place that gives a local batch field its dtype per profile: a clarification
that names a dtype for such a field must agree with it (one that follows the batch's dtype, ``input``,
has no dtype of its own to name). Prose that contradicted the data model once rejected implementations
that followed the prose."""

import re
from dataclasses import replace

import numpy as np
import pytest

from shardspec.conformance.cases import input_space
from shardspec.conformance.cases.boundaries import boundaries
from shardspec.reference.preconditions import check_input_batch
from shardspec.spec.builders import build_input_batch
from shardspec.spec.loader import load_spec
from shardspec.spec.profiles import PROFILES, rules_of

DTYPE_WORDS = ("int32", "int64", "intp", "float32", "bool")


def _local_dtypes(spec) -> dict[str, str]:
    batch = spec.data_model.type("InputBatch")
    return {f.name: f.local.dtype or f.dtype for f in batch.fields if f.local is not None and f.type != "int"}


def contradictions(spec) -> list[str]:
    """'<clarification>: <field> <dtype>' for each dtype the prose names that the data model does not give."""
    local = _local_dtypes(spec)
    found = []
    for cl in spec.clarifications:
        # "seq_lens int32 [0]", "cu_num_logits is int32 [1]", "expanded_idx_mapping and expanded_local_pos int32 [0]"
        pattern = rf"\b([a-z_]+)(?: and ([a-z_]+))? (?:is )?({'|'.join(DTYPE_WORDS)}) \["
        for first, second, dtype in re.findall(pattern, cl.decision.replace("\n", " ")):
            for name in filter(None, (first, second)):
                if name in local and local[name] != dtype:
                    found.append(f"{cl.id}: {name} {dtype} (data model: {local[name]})")
    return found


@pytest.mark.parametrize("profile", PROFILES)
def test_clarifications_name_no_local_dtype_the_data_model_does_not_give(profile):
    assert contradictions(load_spec(profile=profile)) == []


# The data model's ``dtypes`` are the one list of what a field may be passed as: every one of them is accepted by
# the preconditions, and no dtype a precondition rejects (PRE-DTYPES' boundaries) is in it.
def _listed_dtypes(profile: str) -> dict[str, tuple[str, ...]]:
    """The data model's dtypes of each field ``profile`` has (every one it lists, whichever its callers send)."""
    model = input_space.raw_data_model()
    present = {f.path for f in input_space.input_fields(model, rules_of(profile))}
    return {f.path: f.dtypes for f in input_space.input_fields(model, None) if f.dtypes and f.path in present}


def _batch_in(path: str, dtype: str):
    name = path.removeprefix("batch.")
    batch = build_input_batch([0, 3, 1], [2, 1, 2])
    if isinstance(getattr(batch, name), np.ndarray):
        return replace(batch, **{name: getattr(batch, name).astype(getattr(np, dtype))})
    return build_input_batch([0, 3, 1], [2, 1, 2], dtypes={name: dtype})


@pytest.mark.parametrize("profile", PROFILES)
def test_every_dtype_the_data_model_lists_is_accepted(profile):
    listed = {p: d for p, d in _listed_dtypes(profile).items() if p.startswith("batch.")}
    assert listed, profile
    for path, dtypes in listed.items():
        for dtype in dtypes:
            batch = _batch_in(path, dtype)
            check_input_batch(
                batch, max_num_reqs=4, max_num_logits_per_req=2, rules=rules_of(profile)
            )  # raises if refused


@pytest.mark.parametrize("profile", PROFILES)
def test_no_dtype_a_precondition_rejects_is_listed(profile):
    listed = _listed_dtypes(profile)
    rejected = [(f, b.value) for b in boundaries(rules_of(profile)) if b.pre == "PRE-DTYPES" for f in b.fields]
    assert rejected
    assert [(f, v) for f, v in rejected if v in listed.get(f, ())] == []


def test_the_bound_of_seq_lens_is_listed_in_both_integer_dtypes_where_a_profile_has_it():
    """Accepted in either (PRE-SEQ-LENS-UPPER-BOUND asks for no dtype, CL-SEQ-LENS-UPPER-BOUND keeps the batch's),
    it was drawn in int32 only while the data model listed no dtypes for it."""
    for profile in PROFILES:
        want = ("int32", "int64") if rules_of(profile).has_upper_bound else None
        assert _listed_dtypes(profile).get("batch.seq_lens_cpu_upper_bound") == want, profile
