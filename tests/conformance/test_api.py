"""Naming and loading implementations."""

import pytest

from shardspec.conformance.api import (
    ImplChoice,
    ImplementationError,
    implementation_names,
    load_implementation,
)
from shardspec.reference import ReferenceSharder


def test_reference_is_the_default(monkeypatch):
    monkeypatch.delenv("SHARDSPEC_IMPL", raising=False)
    assert implementation_names(None) == ["reference"]
    assert load_implementation("reference").factory is ReferenceSharder


def test_env_and_comma_separated_names(monkeypatch):
    monkeypatch.setenv("SHARDSPEC_IMPL", "reference, pkg.mod:make")
    assert implementation_names(None) == ["reference", "pkg.mod:make"]
    assert implementation_names("production") == ["production"]


def test_module_attr_with_dotted_attribute(plugins_on_path):
    impl = load_implementation("faulty_sharders:RaisingSharder")
    assert impl.factory.__name__ == "RaisingSharder"


@pytest.mark.parametrize(
    "name, words",
    [
        ("nonsense", "unknown implementation"),
        ("no_such_module_xyz:make", "cannot import 'no_such_module_xyz'"),
        ("shardspec.reference:NoSuchThing", "has no attribute 'NoSuchThing'"),
    ],
)
def test_clear_errors(name, words):
    with pytest.raises(ImplementationError, match=words):
        load_implementation(name)


def test_missing_production_is_named(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "shardspec.impl", None)  # import fails
    with pytest.raises(ImplementationError, match="production implementation"):
        load_implementation("production")


def test_mixed_choice_assigns_odd_ranks():
    choice = ImplChoice.parse("reference/x.y:z")
    assert choice == ImplChoice("reference", "x.y:z") and choice.mixed
    assert [choice.for_rank(r) for r in range(4)] == ["reference", "x.y:z", "reference", "x.y:z"]
    assert choice.label == "reference/x.y:z"
    assert choice.cli_args() == ["--impl", "reference/x.y:z"]
    assert not choice.applies_to(1) and choice.applies_to(2)
    assert ImplChoice.parse("production").applies_to(1)


def test_mixed_entries_and_impl_odd_sugar(monkeypatch):
    monkeypatch.delenv("SHARDSPEC_IMPL", raising=False)
    assert implementation_names("reference,production, reference/production") == [
        "reference",
        "production",
        "reference/production",
    ]
    assert implementation_names("reference,production/reference", impl_odd="x.y:z") == [
        "reference/x.y:z",
        "production/reference",
    ]


@pytest.mark.parametrize("entry", ["reference/", "a/b/c", "reference/nonsense"])
def test_malformed_mixed_entries(entry):
    with pytest.raises(ImplementationError):
        implementation_names(entry)
