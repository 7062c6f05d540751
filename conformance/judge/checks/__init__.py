"""One checker per invariant of spec/invariants.yaml, registered by ID.

Importing this package registers every checker in
:data:`base.RANK_CHECKERS` (per rank) and :data:`base.GROUP_CHECKERS` (across
ranks, on digests). An unexpected exception of the implementation is reported
once, under the first invariant of the step that raised
(:data:`base.STEP_REPORTER`).
"""

from shardspec.conformance.judge.checks import (  # noqa: F401  (imported to register)
    all_to_all,
    extensions,
    gather,
    grammar,
    local_batch,
    logprobs,
    metadata,
    ownership,
    rejection,
    step,
    unlisted_fields,
    wire,
)
from shardspec.conformance.judge.checks.base import GROUP_CHECKERS, RANK_CHECKERS

__all__ = ["GROUP_CHECKERS", "RANK_CHECKERS"]
