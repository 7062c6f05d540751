"""Broken handling of what engines add to the step: extension fields, unlisted batch fields."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

from shardspec.reference import ReferenceSharder
from shardspec.spec.model import InputBatch


class DropsExtensionField(ReferenceSharder):
    """INV-GATHER-EXTENSIONS: the first declared extension field is gathered but left out of the result."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        gathered = super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
        if not gathered.extensions:
            return gathered
        dropped = next(iter(gathered.extensions))
        return replace(gathered, extensions={k: v for k, v in gathered.extensions.items() if k != dropped})


class RebuildsLocalBatch(ReferenceSharder):
    """INV-LOCAL-UNLISTED-FIELDS: the local batch is rebuilt as a plain InputBatch, losing the engine's fields."""

    def shard_sampler_inputs(self, batch, grammar, **kwargs):
        result = super().shard_sampler_inputs(batch, grammar, **kwargs)
        local = result.local_batch
        plain = InputBatch(**{f.name: getattr(local, f.name) for f in dataclasses.fields(InputBatch)})
        return result._replace(local_batch=plain)


class ExtensionEntriesRotatedInLargeBatches(ReferenceSharder):
    """INV-GATHER-EXTENSIONS: above 6 requests the gathered extension entries come out rotated by one request
    (an unrolled path for small batches, a wrong one for the rest)."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        gathered = super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
        if not gathered.extensions or global_batch.num_reqs <= 6:
            return gathered
        return replace(gathered, extensions={k: v.roll(1, dims=0) for k, v in gathered.extensions.items()})
