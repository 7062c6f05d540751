"""The reference built under the default profile whatever profile the run judges: it passes a run under the
default profile and fails one under a profile whose rules differ (a reproduce command without the run's
profile would pass)."""

from shardspec.reference import ReferenceSharder


def make(max_num_reqs, max_num_logits_per_req, *, comm, device="cpu"):
    return ReferenceSharder(max_num_reqs, max_num_logits_per_req, comm=comm, device=device)
