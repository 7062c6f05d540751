"""Broken handling of invalid inputs. One defect each."""

from __future__ import annotations

from dataclasses import replace

from shardspec.conformance.broken.support import preconditions_unchecked
from shardspec.reference import ReferenceSharder, preconditions
from shardspec.spec.errors import PreconditionError

# Bounds so large that no capacity or slot-range check can fail.
UNBOUNDED = 1 << 62


class AcceptsBeyondCapacity(ReferenceSharder):
    """INV-REJECT-INVALID: capacity and slot range go unchecked; oversized batches are processed."""

    def shard_sampler_inputs(self, batch, grammar, **kwargs):
        preconditions.check_input_batch(batch, max_num_reqs=UNBOUNDED, max_num_logits_per_req=UNBOUNDED, rank=self.rank)
        preconditions.check_grammar_output(grammar, batch, rank=self.rank)
        with preconditions_unchecked(self):
            return super().shard_sampler_inputs(batch, grammar, **kwargs)


class AnonymousErrors(ReferenceSharder):
    """INV-REJECT-NAMES-PRECONDITION: invalid inputs raise ValueError without the precondition ID."""

    def shard_sampler_inputs(self, batch, grammar, **kwargs):
        try:
            return super().shard_sampler_inputs(batch, grammar, **kwargs)
        except PreconditionError:
            raise ValueError("invalid batch") from None


class ChecksNothing(ReferenceSharder):
    """INV-REJECT-INVALID: no precondition is checked; invalid inputs are processed like valid ones."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "check_preconditions": False})


class AcceptsOnOddRanks(ReferenceSharder):
    """INV-REJECT-INVALID: odd ranks check no precondition: they return normally where even ranks reject."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.check_preconditions = self.rank % 2 == 0


class BuildsForAnyGroup(ReferenceSharder):
    """INV-REJECT-INVALID: builds a sharder for a group of one and for fewer request slots than ranks, as
    under the construction rule any_group, where the profile refuses both (PRE-TP-SIZE, PRE-CAPACITY-TP)."""

    def check_construction(self, rules, comm, max_num_reqs):
        pass


class AcceptsAbsentUpperBound(ReferenceSharder):
    """INV-REJECT-INVALID: takes a batch without seq_lens_cpu_upper_bound, as where the engine may leave it
    out (seq_lens_upper_bound: optional), under a profile whose engine always passes it."""

    def shard_sampler_inputs(self, batch, grammar):
        rules, self.rules = self.rules, replace(self.rules, seq_lens_upper_bound="optional")
        try:
            return super().shard_sampler_inputs(batch, grammar)
        finally:
            self.rules = rules
