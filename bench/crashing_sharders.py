"""Implementations that end every case's launch, for bench/suite_cost.py: the reference's answers,
except that rank 1 leaves in every gather (a crash) or sleeps in C holding the GIL (a hang its own
watchdog cannot see, so the parent has to end it)."""

from __future__ import annotations

import ctypes
import os

from shardspec.reference import ReferenceSharder


class DiesInEveryGather(ReferenceSharder):
    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        if self.rank == 1:
            os._exit(5)
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)


class HangsHoldingTheGilInEveryGather(ReferenceSharder):
    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        if self.rank == 1:
            ctypes.PyDLL(None).sleep(3600)
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
