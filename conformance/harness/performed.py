"""How many collectives this process's process groups performed: counted by c10d, not by the recorder.

Every collective a gloo or NCCL process group runs advances its sequence
number, in C++, whatever issued it: the recorder's patched functions, a
backend method captured before they were patched, an operator run with
torch's dispatch modes disabled, or a call made while the recorder was told
it was already inside one. A rank reads the sum over its process groups
before and after the step's operations; the judge compares the difference
with the calls the recorder saw (INV-WIRE-SEQUENCE). The method is taken
here, when the harness is imported, before any implementation is: replacing
it on the class afterwards does not change what is counted.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed import distributed_c10d

_SEQUENCE = dist.ProcessGroup._get_sequence_number_for_group


def performed() -> int | None:
    """The collectives every process group of this process has performed so far; None without any."""
    if not dist.is_initialized():
        return None
    return sum(_SEQUENCE(group) for group in list(distributed_c10d._world.pg_map))
