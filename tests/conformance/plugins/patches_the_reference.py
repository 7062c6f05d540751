"""A correct sharder whose module, when imported, breaks the reference for everyone else in its process.

Importing it replaces the reference sharder's gather with one that returns
the sampled ids in reverse order; its own class keeps the original. An
entry that runs in the same process afterwards (the reference, say) returns
wrong ids for this module's doing.
"""

from shardspec.reference import sharder as reference_sharder

_original_gather = reference_sharder.ReferenceSharder.gather_sampler_output


class PatchesTheReference(reference_sharder.ReferenceSharder):
    """The reference, unchanged (its gather is the original one)."""

    gather_sampler_output = _original_gather


def _reversed_gather(self, *args, **kwargs):
    out = _original_gather(self, *args, **kwargs)
    out.sampled_token_ids = out.sampled_token_ids.flip(0)
    return out


reference_sharder.ReferenceSharder.gather_sampler_output = _reversed_gather
