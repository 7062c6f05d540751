"""pytest entry of the suite: one test per implementation and group size.

    pytest --pyargs shardspec.conformance -p no:cacheprovider [--junitxml conformance.xml]

Configured by environment variables (the command line's options have the
same meaning): SHARDSPEC_IMPL, SHARDSPEC_IMPL_ODD, SHARDSPEC_TP,
SHARDSPEC_QUICK, SHARDSPEC_MAX_EXAMPLES, SHARDSPEC_SEED, SHARDSPEC_TIMEOUT,
SHARDSPEC_XFAILS and SHARDSPEC_JSON (path of the JSON report). The
per-invariant table is printed at the end of the session.
"""

import os

import pytest

from shardspec.conformance import report
from shardspec.conformance.cli import build_parser, config_from_args

CONFIG = config_from_args(build_parser().parse_args([]))
PARAMS = [(impl, tp) for impl in CONFIG.impls for tp in CONFIG.tp_sizes]


@pytest.fixture(scope="session")
def conformance_session():
    from shardspec.conformance import session as session_module

    return session_module.shared_session(CONFIG)


@pytest.mark.parametrize("impl, tp", PARAMS, ids=[f"{impl}-tp{tp}" for impl, tp in PARAMS])
def test_conformance(impl, tp, conformance_session):
    conformance_session.run(impl, [tp])
    failures = conformance_session.failures(impl, tp, report.load_xfails(os.environ.get("SHARDSPEC_XFAILS")))
    assert not failures, "\n".join(failures)
