"""The shipped documents: schema-valid, versioned, and in step with the code."""

import json
import re
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import tomllib

from shardspec.spec.loader import (
    DOCUMENT_NAMES,
    document_schema,
    load_spec,
    load_yaml_document,
    profile_names,
    select_profile,
)

ROOT = Path(__file__).resolve().parents[2]
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")

# IDs are the contract between spec, checkers, fixtures and reports: they may be
# added or retired, never removed or renamed.
STABLE_INVARIANT_IDS = {
    "INV-OWNER",
    "INV-SORTED-LOGITS-INDICES",
    "INV-SPLITS",
    "INV-META-SCALARS",
    "INV-GATHERED-SRC-INDICES",
    "INV-LOCAL-REQS",
    "INV-LOCAL-IDX-MAPPING",
    "INV-LOCAL-CU-NUM-LOGITS",
    "INV-LOCAL-LOGITS-INDICES",
    "INV-LOCAL-EXPANDED",
    "INV-LOCAL-SEQ-LENS",
    "INV-LOCAL-DRAFTS",
    "INV-LOCAL-GLOBAL-FIELDS",
    "INV-LOCAL-ALIGNMENT",
    "INV-LOCAL-GRAMMAR",
    "INV-A2A-SPLITS",
    "INV-A2A-LAYOUT",
    "INV-WIRE-SEQUENCE",
    "INV-WIRE-SAMPLED",
    "INV-WIRE-LOGPROBS",
    "INV-GATHER-SAMPLED-IDS",
    "INV-GATHER-COUNTS",
    "INV-GATHER-NANS",
    "INV-LOGPROBS-SHAPES",
    "INV-LOGPROBS-VALUES",
    "INV-LOGPROBS-MISSING",
    "INV-CU-NUM-GENERATED",
    "INV-RANK-AGREEMENT",
    "INV-E2E-TRANSPARENCY",
    "INV-INPUTS-UNCHANGED",
    "INV-REJECT-INVALID",
    "INV-REJECT-NAMES-PRECONDITION",
}

# One clarification per point the upstream implementation leaves open.
OPEN_POINTS = {
    "empty batch": "CL-EMPTY-BATCH",
    "ranks that own nothing": "CL-EMPTY-RANK",
    "a rank without logprobs while another has them": "CL-LOGPROBS-MISSING",
    "column widths when ranks disagree": "CL-WIDTHS",
    "negative or out-of-capacity slots": "CL-SLOT-RANGE",
    "requests with 0 logits rows": "CL-ZERO-LOGITS",
    "more logits per request than capacity": "CL-CAPACITY",
    "logits rows that are not the query tail": "CL-LOGITS-TAIL",
    "grammar ids not in the batch or repeated": "CL-GRAMMAR-IDS",
    "bitmask with the wrong row count": "CL-GRAMMAR-BITMASK-ROWS",
    "dtypes of local tensors": "CL-LOCAL-DTYPES",
    "localized versus global local fields": "CL-LOCAL-FIELDS",
    "differences from the replicated path": "CL-REPLICATED-DIFFERENCES",
    "wire padding": "CL-WIRE-PADDING",
    "pad values": "CL-PAD-VALUES",
    "owner rule and identical slots": "CL-OWNER-RULE",
}


@pytest.fixture(scope="module")
def spec():
    return load_spec()


def test_schema_is_a_valid_draft_2020_12_schema():
    schema = json.loads(resources.files("shardspec.spec").joinpath("schema.json").read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("document", ("index", *DOCUMENT_NAMES))
def test_shipped_document_matches_its_schema(document):
    data = load_yaml_document(resources.files("shardspec.spec").joinpath(f"{document}.yaml"), document_schema(document))
    assert isinstance(data, dict) and data


def test_version_is_semver_and_matches_the_distribution(spec):
    assert SEMVER.match(spec.version), spec.version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert spec.version == project["version"]


def test_stable_invariant_ids_are_all_present(spec):
    missing = STABLE_INVARIANT_IDS - {inv.id for inv in spec.invariants}
    assert not missing, f"invariant IDs must never be removed or renamed: {sorted(missing)}"


def test_every_invariant_has_a_rationale(spec):
    assert all(inv.rationale.strip() for inv in spec.invariants)


def test_ids_are_unique_and_looked_up(spec):
    for profile in profile_names(spec):
        selected = select_profile(spec, profile)
        assert len(set(selected.ids)) == len(selected.ids), profile
    assert spec.by_id("CL-EMPTY-BATCH").topic == "Empty batch"


def test_an_id_shared_by_two_entries_names_disjoint_profiles(spec):
    entries = [*spec.invariants, *spec.preconditions, *spec.clarifications]
    for entry_id in {e.id for e in entries}:
        shared = [e for e in entries if e.id == entry_id]
        if len(shared) > 1:
            # Each entry names its bundled profiles, or (no bundled profile selects it) its rule values.
            flat = [p for e in shared for p in e.profiles]
            assert all(e.profiles or e.requires for e in shared) and len(flat) == len(set(flat)), entry_id
    with pytest.raises(KeyError, match="INV-NOPE"):
        spec.by_id("INV-NOPE")


def _precondition_ids_in_code() -> set[str]:
    source = "".join(
        (ROOT / "reference" / name).read_text()
        for name in ("preconditions.py", "output_preconditions.py", "profile_rules.py")
    )
    return set(re.findall(r"[\"'](PRE-[A-Z0-9-]+)[\"']", source))


def test_precondition_ids_in_code_equal_the_document(spec):
    in_code = _precondition_ids_in_code()
    in_yaml = {pre.id for pre in spec.preconditions}
    assert in_code, "found no PRE- literal in reference/preconditions.py"
    assert in_code - in_yaml == set(), f"raised by the reference but not specified: {sorted(in_code - in_yaml)}"
    assert in_yaml - in_code == set(), f"specified but never raised by the reference: {sorted(in_yaml - in_code)}"


def test_every_open_point_has_a_clarification(spec):
    ids = {cl.id for cl in spec.clarifications}
    missing = {point: cl for point, cl in OPEN_POINTS.items() if cl not in ids}
    assert not missing


def test_every_enforced_by_resolves_to_an_invariant_or_precondition(spec):
    known = {e.id for e in (*spec.invariants, *spec.preconditions)}
    for cl in spec.clarifications:
        assert cl.enforced_by, cl.id
        assert set(cl.enforced_by) <= known, (cl.id, set(cl.enforced_by) - known)


def test_clarifications_cited_by_the_reference_exist(spec):
    cited = set()
    for path in (ROOT / "reference").glob("*.py"):
        cited |= set(re.findall(r"\bCL-[A-Z0-9]+(?:-[A-Z0-9]+)*", path.read_text()))
    assert cited, "the reference cites no clarification"
    assert cited <= {cl.id for cl in spec.clarifications}, cited - {cl.id for cl in spec.clarifications}
