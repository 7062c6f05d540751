"""The data model is the one place that gives a local batch field its dtype per profile: a clarification
that names a dtype for such a field must agree with it (one that follows the batch's dtype, ``input``,
has no dtype of its own to name). Prose that contradicted the data model once rejected implementations
that followed the prose."""

import re

import pytest

from shardspec.spec.loader import load_spec
from shardspec.spec.profiles import PROFILES

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
