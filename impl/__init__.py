"""Production implementation of the shardspec contract: Triton kernels and one workspace per sharder.

Runs on CUDA devices and, with ``TRITON_INTERPRET=1``, on CPU tensors.
"""

from shardspec.impl.sharder import ProductionSharder

__all__ = ["ProductionSharder"]
