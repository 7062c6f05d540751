"""Helpers for the conformance harness tests."""

import os

import pytest
from harness_cases import PLUGINS

from shardspec.conformance.judge.checks import base
from shardspec.conformance.judge.checks.base import Violation


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: launches rank processes (several seconds each)")


@pytest.fixture
def plugins_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))


@pytest.fixture
def throwaway_checkers(monkeypatch):
    """Replace the registries with two checkers of this test: counts and wire agreement."""
    seen_digests = []

    def counts(record):
        actual, expected = record.actual.gathered, record.expected.gathered
        if actual is not None and not actual.num_rejected.equal(expected.num_rejected):
            yield Violation("INV-TEST-COUNTS", "num_rejected differs", rank=record.rank, field="num_rejected")

    def wire_agreement(case, digests):
        seen_digests.append(digests)
        kinds = {tuple(w["kind"] for w in d["wire"]) for d in digests.values()}
        if len(kinds) != 1:
            yield Violation("INV-TEST-WIRE", f"ranks disagree: {kinds}")

    # Imported first: a module imported while the registries are replaced would keep the replacement.
    import shardspec.conformance.judge.rank as judging

    monkeypatch.setattr(base, "RANK_CHECKERS", {"INV-TEST-COUNTS": counts})
    monkeypatch.setattr(base, "GROUP_CHECKERS", {"INV-TEST-WIRE": wire_agreement})
    monkeypatch.setattr(judging, "RANK_CHECKERS", base.RANK_CHECKERS)
    monkeypatch.setattr(judging, "GROUP_CHECKERS", base.GROUP_CHECKERS)
    return seen_digests
