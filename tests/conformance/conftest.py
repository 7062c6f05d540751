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
def throwaway_checkers():
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

    # The registries are emptied and refilled in place, never replaced: every module that imported them by
    # name (the judge, the results, the session) sees this test's checkers, whatever was imported first.
    replacements = [
        (base.RANK_CHECKERS, {"INV-TEST-COUNTS": counts}),
        (base.GROUP_CHECKERS, {"INV-TEST-WIRE": wire_agreement}),
    ]
    saved = [(registry, dict(registry)) for registry, _ in replacements]
    for registry, replacement in replacements:
        registry.clear()
        registry.update(replacement)
    yield seen_digests
    for registry, contents in saved:
        registry.clear()
        registry.update(contents)
