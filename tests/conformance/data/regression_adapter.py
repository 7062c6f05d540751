"""One implementation in two versions, to record a regression between two runs.

Version 1 (the default) is the reference sharder; version 2
(``REGRESSION_ADAPTER_VERSION=2``) computes owners as ``(slot // tp) mod tp``
(the broken corpus's OwnerBySlotDivision). Both runs carry the same label,
``regression_adapter:make_sharder``, as two builds of one engine would.
"""

import os

from shardspec.conformance.broken.shard import OwnerBySlotDivision
from shardspec.reference import ReferenceSharder


def make_sharder(max_num_reqs, max_num_logits_per_req, *, comm, device):
    regressed = os.environ.get("REGRESSION_ADAPTER_VERSION", "1") == "2"
    factory = OwnerBySlotDivision if regressed else ReferenceSharder
    return factory(max_num_reqs, max_num_logits_per_req, comm=comm, device=device)
