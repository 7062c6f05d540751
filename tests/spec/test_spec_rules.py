"""Profiles as rule sets: the registry of rules, the bundled profile files, a user's own file, and the
packages reading rules rather than profile names."""

import dataclasses
import pathlib
import re

import pytest

from shardspec.spec.loader import load_spec
from shardspec.spec.profiles import (
    PROFILES,
    ProfileError,
    bundled_profile,
    load_profile_file,
    read_profile,
    root_profile,
    rules_of,
)
from shardspec.spec.rules import RULES, RULES_BY_NAME, Rule, Rules, rule_problem

ROOT = pathlib.Path(__file__).parents[2]
DATA = ROOT / "tests" / "conformance" / "data" / "profiles"


def test_rules_lists_every_rule_of_the_registry_in_order():
    assert [f.name for f in dataclasses.fields(Rules)][1:] == [rule.name for rule in RULES]
    for rule in RULES:
        assert rule.doc and rule.values and all(rule.values.values())
        assert set(rule.unsupported) <= set(rule.values)


def test_the_bundled_profiles_extend_one_root():
    assert {root_profile(name) for name in PROFILES} == {"vllm-seed"}
    assert bundled_profile("vllm-seed").extends is None and len(bundled_profile("vllm-seed").own) == len(RULES)
    assert bundled_profile("vllm-0.33").extends == "vllm-seed"
    assert bundled_profile("vllm-0.34").extends == "vllm-0.33"


def test_vllm_034_changes_what_vllm_034_changed():
    new, old = rules_of("vllm-0.34").as_dict(), rules_of("vllm-0.33").as_dict()
    assert {rule: new[rule] for rule in new if new[rule] != old[rule]} == {
        "owner": "position_mod_tp",
        "acceptable_drafts": "none",
        "logprob_width": "max_k_t",
        "exchange": "all_to_all_vocab_shards",
        "communicator": "engine",
    }


def test_vllms_profiles_trust_their_caller_and_the_strict_one_does_not():
    """vLLM's profiles state what its engine sends (contiguous inputs in its own dtypes, every precondition
    kept by its scheduler; no extension fields from 0.33 on); the strict profile is 0.34's with none of them."""
    guarantees = ("layouts", "dtypes", "preconditions", "extension_fields")
    for name in ("vllm-seed", "vllm-0.33", "vllm-0.34", "vllm-0.34-sharded-draft-cache"):
        rules = rules_of(name)
        assert (rules.contiguous_only, rules.engine_dtypes_only, rules.trusts_caller) == (True, True, True), name
    # Extension fields up to the seed's revision only: 0.33.0's config already refuses return_sampling_mask.
    assert rules_of("vllm-seed").has_extension_fields and not rules_of("vllm-0.33").has_extension_fields
    strict = bundled_profile("vllm-0.34-strict")
    assert strict.extends == "vllm-0.34" and set(strict.own) == set(guarantees)
    rules = strict.rules
    assert not (rules.contiguous_only or rules.engine_dtypes_only or rules.trusts_caller)
    assert rules.has_extension_fields
    others = {rule.name for rule in RULES} - set(guarantees)
    assert {r: getattr(rules, r) for r in others} == {r: getattr(rules_of("vllm-0.34"), r) for r in others}


@pytest.mark.parametrize(
    "name, message",
    [
        ("bad-rule.yaml", "unknown rule 'owners' (rules: owner,"),
        ("bad-value.yaml", "rule owner: unknown value 'slot_div_tp' (values: slot_mod_tp,"),
        ("bad-parent.yaml", f"extends unknown profile 'vllm-0.99' (bundled: {', '.join(PROFILES)})"),
    ],
)
def test_a_bad_profile_file_is_one_line_naming_the_file_and_what(name, message):
    with pytest.raises(ProfileError) as caught:
        read_profile(DATA / name, None)
    text = str(caught.value)
    assert text.startswith(str(DATA / name)) and message in text and "\n" not in text


def test_a_rule_problem_names_the_rule_and_its_values(monkeypatch):
    assert rule_problem("owner", "slot_mod_tp") is None
    assert "unknown rule 'colour'" in rule_problem("colour", "red")
    assert rule_problem("seq_lens_upper_bound", "always") is None  # vllm-0.33's and vllm-0.34's
    # No value is declared but unsupported today (always and the owner tables are supported); one that is:
    monkeypatch.setitem(RULES_BY_NAME, "colour", Rule("colour", "a test rule", {"red": "red"}, unsupported=("red",)))
    assert rule_problem("colour", "red").endswith("declared but not supported yet")


def test_the_construction_rule_sets_the_smallest_group_and_capacity():
    from shardspec.spec.profiles import rules_of

    sharded, any_group = rules_of("vllm-0.34"), rules_of("vllm-seed")
    assert (sharded.min_tp, sharded.min_capacity(4), sharded.sharded_groups_only) == (2, 4, True)
    # vLLM 0.33.0's config refuses small groups as 0.34.0's does: vllm-0.34 inherits the rule from vllm-0.33.
    assert rules_of("vllm-0.33").construction == "sharded_groups" == sharded.construction
    assert "construction" in bundled_profile("vllm-0.33").own and "construction" not in bundled_profile("vllm-0.34").own
    assert (any_group.min_tp, any_group.min_capacity(4), any_group.sharded_groups_only) == (1, 1, False)
    assert rules_of("vllm-0.33").upper_bound_required and not any_group.has_upper_bound


def test_a_users_profile_selects_entries_by_its_rules():
    name = load_profile_file(DATA / "position-owner.yaml").name
    spec = load_spec(profile=name)
    owner = [inv for inv in spec.invariants if inv.id == "INV-OWNER"]
    assert len(owner) == 1 and "batch position" in owner[0].statement
    grammar = [inv for inv in spec.invariants if inv.id == "INV-LOCAL-GRAMMAR"]
    assert len(grammar) == 1 and "num_acceptable_drafts" in grammar[0].statement  # vllm-0.33's, kept


def test_no_package_compares_a_profile_name():
    pattern = re.compile(r"profile [!=]= |VLLM_0[0-9]+")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("spec", "reference", "impl", "conformance")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if pattern.search(line)
    ]
    assert found == []


def test_a_file_registered_again_is_the_one_handed_on(tmp_path):
    """A run registering its file again after another one (an earlier run of the same process) judges under
    its own, and reports its own (the path and sha256 of the file it read: profile_source)."""
    import shardspec.spec.profiles as profiles

    mine = pathlib.Path(__file__).parents[1] / "conformance" / "data" / "profiles" / "position-owner.yaml"
    other = tmp_path / "other.yaml"
    other.write_text(
        "name: position-owner\nextends: vllm-0.34\nupstream: u\nmeaning: m\nrules:\n  owner: slot_mod_tp\n"
    )
    for path in (other, mine):
        profiles.load_profile_file(path)
    assert rules_of("position-owner").owner == "position_mod_tp"
    assert profiles.profile_source("position-owner")["path"] == str(mine.absolute())
