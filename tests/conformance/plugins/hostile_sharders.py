"""Implementations that attack the run rather than the spec: each must get an exact, bounded verdict.

Each misbehaves on rank 1 for batches of exactly 3 requests (see faulty_sharders), so the other cases
of the run show that the run went on.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

from faulty_sharders import _Base

import shardspec.conformance.judge.checks.base as checks_base
from shardspec.reference import ReferenceSharder


class _OnGather(_Base):
    def attack(self) -> None:
        raise NotImplementedError

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        if self._triggered(global_batch):
            self.attack()
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)


class SegfaultInGather(_OnGather):
    def attack(self) -> None:
        ctypes.string_at(0)


class AbortInGather(_OnGather):
    def attack(self) -> None:
        os.abort()


class ExitInGather(_OnGather):
    def attack(self) -> None:
        sys.exit(3)


class StopInGather(_OnGather):
    """SIGSTOP: no thread of the rank runs again, its own watchdog included."""

    def attack(self) -> None:
        os.kill(os.getpid(), signal.SIGSTOP)


class GilHangInGather(_OnGather):
    """Sleeps in C while holding the GIL: the rank's watchdog thread never runs."""

    def attack(self) -> None:
        ctypes.PyDLL(None).sleep(3600)


class FloodAndLeakInGather(_OnGather):
    """Floods stdout and leaves a thread running, then behaves: the verdict must be a pass."""

    def attack(self) -> None:
        threading.Thread(target=lambda: threading.Event().wait(), daemon=False).start()
        sys.stdout.write("x" * 1_000_000 + "\n")


class HugeAllocationInGather(_OnGather):
    def attack(self) -> None:
        import torch

        torch.empty(1 << 50, dtype=torch.uint8)


# Importing this module empties the checker registries of the process that imports it.
checks_base.RANK_CHECKERS.clear()
checks_base.GROUP_CHECKERS.clear()


class ReversedIdsUnchecked(ReferenceSharder):
    """Returns the sampled ids in reverse batch order, after disabling the checks where it runs."""

    def gather_sampler_output(self, *args, **kwargs):
        out = super().gather_sampler_output(*args, **kwargs)
        out.sampled_token_ids = out.sampled_token_ids.flip(0)
        return out
