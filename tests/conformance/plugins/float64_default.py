"""A sharder that makes float64 torch's default dtype in its shard step, and leaves it so: every tensor
created without a dtype afterwards in its process (by it, or by an entry that runs there after it) is
float64."""

import torch

from shardspec.reference import ReferenceSharder


class Float64Default(ReferenceSharder):
    """The reference, after ``torch.set_default_dtype(torch.float64)`` in its shard step."""

    def shard_sampler_inputs(self, *args, **kwargs):
        torch.set_default_dtype(torch.float64)
        return super().shard_sampler_inputs(*args, **kwargs)
