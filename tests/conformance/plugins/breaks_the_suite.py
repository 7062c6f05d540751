"""A pytest plugin (test data) under which the suite's own run raises for one group size, as a bug of the suite
(or a crash while it computes the expectations) would: the tests of that size error, no cell fails."""

from shardspec.conformance.run.session import ConformanceSession

_run = ConformanceSession.run


def _breaks_at_tp_2(self, impl, tp_sizes=None):
    if tp_sizes == [2]:
        raise RuntimeError("the suite's own run raised")
    return _run(self, impl, tp_sizes)


ConformanceSession.run = _breaks_at_tp_2
