"""The suite's tests, parametrized by the plugin (:mod:`shardspec.conformance.plugin`):
``pytest --pyargs shardspec.conformance [--shardspec-impl ...]``."""

from shardspec.conformance.plugin import verdict_of


def test_invariant(shardspec_run, shardspec_entry, shardspec_tp, shardspec_invariant, record_testsuite_property):
    record_testsuite_property("shardspec_profile", shardspec_run.config.profile)  # the JUnit report names it
    shardspec_run.run(shardspec_entry, [shardspec_tp])
    verdict_of(shardspec_run, shardspec_entry, shardspec_tp, shardspec_invariant)
