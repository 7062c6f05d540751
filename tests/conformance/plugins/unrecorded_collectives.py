"""Sharders that issue an extra all_reduce of zeros in their gather, each around the recorder in its own way;
their outputs are the reference's, so only the count of collectives the process groups performed tells."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.utils._python_dispatch import _disable_current_modes

from shardspec.reference import ReferenceSharder

# The gloo backend's own method, taken at import, before the suite patches anything for the step.
_ALLREDUCE = dist.ProcessGroupGloo.allreduce


def _group(sharder):
    return getattr(sharder.comm, "group", None) or dist.group.WORLD


class RecorderSwitchedOff(ReferenceSharder):
    """Tells the recorder it is already inside a recorded call (``comm._inside.active``) around its all_reduce."""

    def gather_sampler_output(self, *args, **kwargs):
        self.comm._inside.active = True
        try:
            dist.all_reduce(torch.zeros(1), group=_group(self))
        finally:
            self.comm._inside.active = False
        return super().gather_sampler_output(*args, **kwargs)


class CapturedBackendAllreduce(ReferenceSharder):
    """Calls the gloo backend's allreduce method it took at import time, on the TP group's backend."""

    def gather_sampler_output(self, *args, **kwargs):
        _ALLREDUCE(_group(self)._get_backend(torch.device("cpu")), [torch.zeros(1)]).wait()
        return super().gather_sampler_output(*args, **kwargs)


class DispatchModesDisabled(ReferenceSharder):
    """Runs a functional all_reduce with torch's dispatch modes disabled."""

    def gather_sampler_output(self, *args, **kwargs):
        with _disable_current_modes():
            funcol.wait_tensor(funcol.all_reduce(torch.zeros(1), "sum", _group(self)))
        return super().gather_sampler_output(*args, **kwargs)
