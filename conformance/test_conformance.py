"""pytest entry of the suite: one test per implementation and group size.

    pytest --pyargs shardspec.conformance -p no:cacheprovider [--junitxml conformance.xml]

Configured by environment variables (the command line's options have the
same meaning): SHARDSPEC_IMPL, SHARDSPEC_IMPL_ODD, SHARDSPEC_TP,
SHARDSPEC_QUICK, SHARDSPEC_MAX_EXAMPLES, SHARDSPEC_MIXED_MAX_EXAMPLES, SHARDSPEC_SEED, SHARDSPEC_TIMEOUT,
SHARDSPEC_XFAILS and SHARDSPEC_JSON (path of the JSON report). The
per-invariant table is printed at the end of the session.
"""

import os

import pytest

from shardspec.conformance import report
from shardspec.conformance.api import ImplChoice
from shardspec.conformance.cli import build_parser, config_from_args

CONFIG = config_from_args(build_parser().parse_args([]))
# Size by size: every entry runs at a group size in the same launches.
PARAMS = [(impl, tp) for tp in CONFIG.tp_sizes for impl in CONFIG.impls]


@pytest.fixture(scope="session")
def conformance_session():
    from shardspec.conformance import session as session_module

    return session_module.shared_session(CONFIG)


@pytest.mark.parametrize("impl, tp", PARAMS, ids=[f"{impl}-tp{tp}" for impl, tp in PARAMS])
def test_conformance(impl, tp, conformance_session):
    if not ImplChoice.parse(impl).applies_to(tp):
        pytest.skip(f"{impl} at tp {tp}: not applicable (a mixed group needs an odd rank)")
    conformance_session.run(impl, [tp])
    failures = conformance_session.failures(impl, tp, report.load_xfails(os.environ.get("SHARDSPEC_XFAILS")))
    assert not failures, "\n".join(failures)
