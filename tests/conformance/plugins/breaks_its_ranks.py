"""An implementation whose ranks die before any case: importing it (which the preloaded rank server does
before forking the ranks) makes a rank's reading of its case plans raise, as a decode error of what a rank
read on a GPU did (issue 35). The process that checks it can be loaded never reads them, so it loads."""

import shardspec.conformance.harness.worker as worker
from shardspec.reference import ReferenceSharder


def _load_plans(path):
    raise RuntimeError("expected[0].wire[0].send: AttributeError: 'torch.device' object has no attribute 'startswith'")


# Where the rank worker calls it (it imports the function at its top).
worker.load_plans = _load_plans


class X(ReferenceSharder):
    pass
