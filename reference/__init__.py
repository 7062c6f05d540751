"""Pure-torch reference implementation of the shardspec contract.

Written from the spec for clarity, not speed. Every function takes the rank,
group size and communicator explicitly; nothing is global.
"""

from shardspec.reference.plan import ShardPlan, build_plan
from shardspec.reference.sharder import ReferenceSharder

__all__ = ["ShardPlan", "build_plan", "ReferenceSharder"]
