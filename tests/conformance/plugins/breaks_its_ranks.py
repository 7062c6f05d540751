"""An implementation whose ranks die before any case: importing it (which the preloaded rank server does
before forking the ranks) makes a rank's reading of its expectations raise, as a decode error on a GPU did
(issue 35). The process that checks it can be loaded never reads expectations, so it loads."""

import shardspec.conformance.harness.expectations as expectations
from shardspec.reference import ReferenceSharder


def _load_expectations(path, device):
    raise RuntimeError("expected[0].wire[0].send: AttributeError: 'torch.device' object has no attribute 'startswith'")


expectations.load_expectations = _load_expectations


class X(ReferenceSharder):
    pass
