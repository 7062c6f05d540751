"""Every precondition decides its rejection in one place, and the rest of the spec agrees with it."""

import inspect
import re

import pytest

from shardspec.reference import ReferenceSharder
from shardspec.spec.loader import load_spec, must_reject_ids, spec_version, target_version_warning
from shardspec.spec.render import render

# Rank-local arguments: only the rank that holds them can see a violation (CL-REJECTION-RANKS).
RANK_LOCAL = {"PRE-LOCAL-OUTPUT", "PRE-LOGITS-SHARD", "PRE-EXTENSION-FIELDS"}


@pytest.fixture(scope="module")
def spec():
    return load_spec()


def test_every_precondition_has_an_outcome_and_a_reason(spec):
    for pre in spec.preconditions:
        assert pre.on_violation.outcome in ("reject", "undefined"), pre.id
        assert len(pre.on_violation.reason.split()) >= 8, f"{pre.id}: the reason must say why"


def test_rejected_preconditions_say_which_ranks_raise(spec):
    for pre in spec.preconditions:
        if pre.must_reject:
            want = "the faulty rank" if pre.id in RANK_LOCAL else "every rank"
            assert pre.on_violation.raised_on == want, pre.id
        else:
            assert pre.on_violation.raised_on is None, pre.id


def test_must_reject_ids_follow_the_yaml(spec):
    ids = must_reject_ids(spec)
    assert "PRE-SLOT-RANGE" in ids and "PRE-LOCAL-OUTPUT" in ids and "PRE-EXTENSION-SUPPORTED" in ids
    assert "PRE-HOST-DEVICE-MATCH" not in ids and "PRE-LOGITS-TAIL" not in ids
    assert set(ids) == {p.id for p in spec.preconditions if p.on_violation.outcome == "reject"}


def test_the_package_s_must_reject_ids_are_read_once_per_process(spec, monkeypatch):
    # A rank asks for every case it runs; parsing the YAML each time was most of a rank's time.
    assert must_reject_ids() == must_reject_ids(spec)
    monkeypatch.setattr("shardspec.spec.loader.load_spec", lambda *a, **k: pytest.fail("the spec was read again"))
    assert must_reject_ids() == must_reject_ids(spec)


def test_spec_md_shows_each_decision_beside_its_precondition(spec):
    text = render(spec)
    for pre in spec.preconditions:
        section = text.split(f"#### {pre.id} ·", 1)[1].split("####", 1)[0]
        expected = "MUST be rejected" if pre.must_reject else "undefined (the caller's fault)"
        assert f"*On violation:* {expected}" in section, pre.id
        row = re.search(rf"\| \[{pre.id}\]\(#[a-z-]+\) \| {pre.step} \| {pre.on_violation.outcome} \|", text)
        assert row, f"{pre.id} is missing from the rejection table"


def test_spec_version_is_exposed_without_loading_every_document(spec):
    assert spec_version() == spec.version == "0.5.0"


def _documented_signature(spec, method: str) -> list[str]:
    body = dict(spec.sections)["Operations and their signatures"]
    text = body.split(f"Sharder.{method}(", 1)[1].split(") ->", 1)[0]
    return re.findall(r"(\w+):", text)


@pytest.mark.parametrize("method", ["shard_sampler_inputs", "all_to_all_logits", "gather_sampler_output"])
def test_documented_signatures_are_the_reference_s(spec, method):
    parameters = [name for name in inspect.signature(getattr(ReferenceSharder, method)).parameters if name != "self"]
    assert _documented_signature(spec, method) == parameters


def test_a_factory_targeting_another_minor_version_gets_a_warning():
    def make_sharder():
        pass

    assert target_version_warning(make_sharder) is None  # declares nothing
    make_sharder.SPEC_VERSION = "0.2.7"
    assert target_version_warning(make_sharder, checked="0.2.0") is None  # another patch only
    make_sharder.SPEC_VERSION = "0.2.0"
    warning = target_version_warning(make_sharder, checked="0.4.0")
    assert "targets spec 0.2.0" in warning and "checks spec 0.4.0" in warning


def test_the_reference_targets_this_version():
    assert ReferenceSharder.SPEC_VERSION == spec_version()
    assert target_version_warning(ReferenceSharder) is None
