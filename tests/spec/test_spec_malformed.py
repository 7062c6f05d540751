"""Malformed spec files give one SpecFileError naming file, place and field."""

import shutil
from importlib import resources
from pathlib import Path

import pytest

from shardspec.spec.errors import SpecFileError
from shardspec.spec.loader import document_schema, load_spec, load_yaml_document

MALFORMED = Path(__file__).parent / "malformed"

# file, document it stands for, place named, field (or key) named
SCHEMA_CASES = [
    ("invariants_bad_level.yaml", "invariants", "invariants[1].level", "level"),
    ("invariants_missing_rationale.yaml", "invariants", "invariants[0].rationale", "rationale"),
    ("invariants_bad_id.yaml", "invariants", "invariants[0].id", "id"),
    ("invariants_unknown_key.yaml", "invariants", "invariants[0].severity", "severity"),
    ("invariants_bad_step.yaml", "invariants", "invariants[0].step", "step"),
    ("invariants_bad_field_path.yaml", "invariants", "invariants[0].fields[1]", "fields"),
    ("invariants_syntax_error.yaml", "invariants", "line 9, column 1", "flow sequence"),
    ("invariants_duplicate_key.yaml", "invariants", "line 6, column 5", "level"),
    ("preconditions_bad_error.yaml", "preconditions", "preconditions[0].error", "error"),
    ("clarifications_missing_enforced_by.yaml", "clarifications", "clarifications[0].enforced_by", "enforced_by"),
    ("index_bad_version.yaml", "index", "version", "version"),
    ("data_model_bad_placement.yaml", "data_model", "types[0].fields[0].placement", "placement"),
]

# Schema-valid files whose references are wrong: caught by load_spec.
REFERENCE_CASES = [
    ("invariants_duplicate_id.yaml", "invariants.yaml", "invariants[1].id", "INV-OWNER"),
    ("invariants_unknown_field.yaml", "invariants.yaml", "invariants[0].fields[1]", "local_batch.no_such_field"),
    ("invariants_wrong_step.yaml", "invariants.yaml", "invariants[0].fields[0]", "sorted_logits_indices"),
    ("clarifications_unknown_ref.yaml", "clarifications.yaml", "clarifications[0].enforced_by[1]", "INV-NO-SUCH-THING"),
    ("data_model_unknown_symbol.yaml", "data_model.yaml", "types[0].fields[0].shape[0]", "Q"),
    ("index_missing_document.yaml", "index.yaml", "documents", "clarifications"),
]


def _assert_names(error: SpecFileError, file_name: str, place: str, field: str) -> None:
    message = str(error)
    assert file_name in message, message
    assert f"at {place}:" in message, message
    assert field in message.split(f"at {place}:", 1)[1], message
    assert error.place == place


@pytest.mark.parametrize("file_name, document, place, field", SCHEMA_CASES)
def test_malformed_document_names_file_place_and_field(file_name, document, place, field):
    with pytest.raises(SpecFileError) as info:
        load_yaml_document(MALFORMED / file_name, document_schema(document))
    _assert_names(info.value, file_name, place, field)
    # One clean error: no yaml or jsonschema exception chained onto it.
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__


@pytest.fixture
def spec_copy(tmp_path):
    """A writable copy of the shipped spec documents."""
    source = resources.files("shardspec.spec")
    for entry in source.iterdir():
        if entry.name.endswith((".yaml", ".json")):
            (tmp_path / entry.name).write_text(entry.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "profiles").mkdir()
    for entry in source.joinpath("profiles").iterdir():
        if entry.name.endswith(".yaml"):
            (tmp_path / "profiles" / entry.name).write_text(entry.read_text(encoding="utf-8"), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("file_name, replaces, place, named", REFERENCE_CASES)
def test_broken_reference_names_file_place_and_field(spec_copy, file_name, replaces, place, named):
    shutil.copyfile(MALFORMED / file_name, spec_copy / replaces)
    with pytest.raises(SpecFileError) as info:
        load_spec(spec_copy)
    _assert_names(info.value, str(spec_copy / replaces), place, named)


def test_the_unmodified_copy_loads(spec_copy):
    assert load_spec(spec_copy) == load_spec()


def test_every_malformed_file_is_exercised():
    used = {case[0] for case in SCHEMA_CASES + REFERENCE_CASES}
    assert used == {path.name for path in MALFORMED.glob("*.yaml")}


def test_missing_file_is_a_spec_file_error(tmp_path):
    with pytest.raises(SpecFileError) as info:
        load_yaml_document(tmp_path / "absent.yaml", document_schema("invariants"))
    assert "absent.yaml" in str(info.value) and info.value.place == "file"


def test_unknown_document_schema_is_refused():
    with pytest.raises(KeyError, match="no_such_document"):
        document_schema("no_such_document")
