"""Which of the caller's guarantees a case breaks (spec/guarantees.py), from the profile's rules alone."""

import dataclasses

import pytest

from shardspec.fixtures import load_case
from shardspec.spec.guarantees import Breach, broken_guarantee, engine_dtypes
from shardspec.spec.profiles import rules_of
from shardspec.spec.rules import Rules

TRUSTING = rules_of("vllm-0.34")
STRICT = rules_of("vllm-0.34-strict")


def _case(case_id: str):
    return load_case(case_id, "vllm-0.34")


@pytest.mark.parametrize(
    "case_id, rule, what",
    [
        ("tp2-error-capacity-reqs", "preconditions", "PRE-CAPACITY-REQS"),
        ("tp2-undefined-host-device-match", "preconditions", "PRE-HOST-DEVICE-MATCH"),
        ("tp2-extensions", "extension_fields", "extension fields declared"),
        ("tp2-valid-strided-inputs", "layouts", "strided view"),
        ("tp2-valid-idx-mapping-np-int32", "dtypes", "idx_mapping_np in int32"),
        ("tp3-valid-draft-counts-int64", "dtypes", "num_draft_tokens_per_req in int64"),
        ("tp2-idle-rank-int64-prefix-sums", "dtypes", "cu_num_logits in int64"),
    ],
)
def test_a_case_the_engine_never_sends_breaks_one_guarantee_and_only_under_a_trusting_profile(case_id, rule, what):
    case = _case(case_id)
    found = broken_guarantee(case, TRUSTING)
    assert isinstance(found, Breach) and found.rule == rule and what in found.what
    assert str(found).startswith(f"{rule}: {getattr(TRUSTING, rule)}: ")
    assert broken_guarantee(case, STRICT) is None


@pytest.mark.parametrize("case_id", ["tp2-decode", "tp4-valid-offset-inputs", "tp1-reject-tp-size"])
def test_what_the_engine_sends_and_construction_refusals_break_none(case_id):
    """An offset view is contiguous memory; a refused construction is the construction rule's, judged always."""
    assert broken_guarantee(_case(case_id), TRUSTING) is None


def test_each_rule_alone_decides_its_guarantee():
    """Setting one rule to the strict value clears exactly the breaches of that rule."""
    strided = _case("tp2-valid-strided-inputs")
    assert broken_guarantee(strided, dataclasses.replace(TRUSTING, layouts="views")) is None
    assert broken_guarantee(strided, dataclasses.replace(STRICT, layouts="contiguous")).rule == "layouts"
    rejected = _case("tp2-error-capacity-reqs")
    assert broken_guarantee(rejected, dataclasses.replace(STRICT, preconditions="trusted")).rule == "preconditions"
    int32 = _case("tp2-valid-idx-mapping-np-int32")
    assert broken_guarantee(int32, dataclasses.replace(STRICT, dtypes="engine")).rule == "dtypes"
    extensions = _case("tp2-extensions")
    assert broken_guarantee(extensions, dataclasses.replace(STRICT, extension_fields="none")).rule == "extension_fields"


def test_a_step_that_breaks_one_puts_its_whole_case_outside():
    first = _case("tp2-decode")
    case = dataclasses.replace(first, then=[dataclasses.replace(first, layouts={"seq_lens": "strided"})])
    assert broken_guarantee(case, TRUSTING).what == "seq_lens passed as a strided view"


def test_the_engine_dtypes_are_the_data_models_and_vllms_own():
    """The engine's own dtype per field: the data model's dtype, and vLLM's expanded_idx_mapping (idx_mapping's
    int64, which the builders do not make)."""
    dtypes = engine_dtypes()
    assert dtypes["idx_mapping"] == ("int64",) and dtypes["cu_num_logits"] == ("int32",)
    assert dtypes["idx_mapping_np"] == ("intp",) and dtypes["num_draft_tokens_per_req"] == ("int32",)
    assert dtypes["expanded_idx_mapping"] == ("int32", "int64")
    engine_int64 = dataclasses.replace(_case("tp2-decode"), batch_dtypes={"expanded_idx_mapping": "int64"})
    assert broken_guarantee(engine_int64, TRUSTING) is None
    assert broken_guarantee(dataclasses.replace(engine_int64, batch_dtypes={"seq_lens": "int64"}), TRUSTING)


def test_the_function_reads_rules_not_names():
    renamed = Rules.of("someone-else", TRUSTING.as_dict())
    assert broken_guarantee(_case("tp2-valid-strided-inputs"), renamed).rule == "layouts"
