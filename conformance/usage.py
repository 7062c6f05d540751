"""What a user may ask of a run, and the error that says they asked for too much or for nonsense.

A leaf: it imports nothing of shardspec, so that the options table, the command line and the checks of
a case named on the command line (cases/limits.py) share one error and one set of bounds without the
cases reaching up to the command line.
"""

from __future__ import annotations

# The suite starts every rank on this machine; a world larger than this is a mistake, not a test.
MAX_TP = 64
MAX_TP_GROUPS = 8
# The most generated cases per group size a run draws (hypothesis is asked for three times as many).
MAX_EXAMPLES = 10_000
# Generated cases drawn per size at least; a run of fewer judges those of them that draw the most of the
# input space beyond the fixtures (cases/spread.py), so that fewer cases lose no variation. The default
# run judges DEFAULT_MAX_EXAMPLES, which draw as many variations as the whole pool does: the greedy choice
# needed at most 24 at any tp for seeds 0 to 3 (16 to 24 per tp), so one is spare;
# tests/meta/test_default_run_coverage.py checks seed 0's.
GENERATED_POOL = 100
DEFAULT_MAX_EXAMPLES = 25
# A mixed entry A/B runs no more: it mostly tests the wire between two implementations.
MIXED_MAX_EXAMPLES = 25
# --size-tier (cases/deployment.py): "default" draws each size engines deploy once among a run's cases, "deploy" only
# those sizes, each at every group size, and larger ones.
DEFAULT_TIER, DEPLOY_TIER = SIZE_TIERS = ("default", "deploy")
# Seconds a timeout (--timeout, --pg-timeout) may be: below the least a case needs to start, every case times
# out and the run proves nothing; above a day, a hang is never caught (and timers overflow).
MIN_TIMEOUT_S = 1.0
MAX_TIMEOUT_S = 86_400.0


class UsageError(ValueError):
    """A bad option, environment variable or named case; the message names it."""
