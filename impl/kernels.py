"""What the production sharder's Triton kernels share: reading a request's rows, and block sizes.

Three launches per step, each over blocks of requests (never one program per
request, so the interpreter stays fast on the CPU and a GPU launch stays small):

* ``shard_plan_kernel`` (``shard_kernel.py``): owner-sorted logits indices,
  gathered source indices and every device field of the local batch, from the
  batch's device copies.
* ``pack_kernel`` (``gather_kernels.py``): the rank's sampled ids, counts, NaN
  sums and logprobs into the all-gather send buffers (wire layout of the spec,
  padding rows included).
* ``unpack_kernel`` (``gather_kernels.py``): the gathered buffers back into
  batch order.

Every integer that changes from step to step is excluded from specialization,
so a new batch size never triggers a recompilation, and so is the alignment of
every pointer a caller supplies (see ``launch.py``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def request_rows(cu_ptr, cu_stride, reqs, valid):
    """(first logits row, number of rows) of requests ``reqs``; the prefix sum is read by its stride."""
    first = tl.load(cu_ptr + reqs * cu_stride, mask=valid, other=0)
    counts = (tl.load(cu_ptr + (reqs + 1) * cu_stride, mask=valid, other=0) - first).to(tl.int32)
    return first, counts


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): the block and padding sizes of the kernels."""
    return 1 << (max(1, int(n)) - 1).bit_length()
