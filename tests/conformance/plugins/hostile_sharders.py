"""Implementations that attack the run rather than the spec: each must get an exact, bounded verdict.

Each misbehaves on rank 1 for batches of exactly 3 requests (see faulty_sharders), so the other cases
of the run show that the run went on.
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import torch
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


_RAN_A_CASE = []  # per rank process: a gather ran here before


class AbortsAfterAnEarlierCase(_Base):
    """A heap an earlier case corrupted: the triggering case aborts (SIGABRT) in its gather where an earlier case
    ran in the same process, and passes in a process of its own."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        if self._triggered(global_batch) and _RAN_A_CASE:
            os.abort()
        _RAN_A_CASE.append(True)
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)


class ExitInGather(_OnGather):
    def attack(self) -> None:
        sys.exit(3)


class ExitOnRankZeroInGather(ReferenceSharder):
    """Rank 0 (not the usual rank 1) exits: its peer's broken collective must not be blamed on the peer."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        if global_batch.num_reqs == 3 and self.rank == 0:
            sys.exit(3)
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)


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


class CutsItsTranscriptInGather(_OnGather):
    """Appends to its rank's transcript the header of a frame it never writes: nothing after it can be read."""

    def attack(self) -> None:
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.endswith(".frames"):
                os.write(int(fd), struct.pack("<Q", 1 << 40) + b"cut")


class _SpoilsItsResult(_Base):
    def spoil(self, out):
        raise NotImplementedError

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        out = super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)
        return self.spoil(out) if self._triggered(global_batch) else out


class _Opaque:
    pass


class ObjectArrayInResult(_SpoilsItsResult):
    """Its gathered num_nans is a numpy array of objects, which the judge's unpickler never loads."""

    def spoil(self, out):
        return replace(out, num_nans=np.array([_Opaque(), _Opaque()], dtype=object))


class UnsupportedDtypeInResult(_SpoilsItsResult):
    """Its gathered num_nans is a complex128 tensor, a dtype the judge does not rebuild."""

    def spoil(self, out):
        return replace(out, num_nans=torch.zeros(out.num_sampled.shape[0], dtype=torch.complex128))


# Importing this module empties the checker registries of the process that imports it.
checks_base.RANK_CHECKERS.clear()
checks_base.GROUP_CHECKERS.clear()


class ReversedIdsUnchecked(ReferenceSharder):
    """Returns the sampled ids in reverse batch order, after disabling the checks where it runs."""

    def gather_sampler_output(self, *args, **kwargs):
        out = super().gather_sampler_output(*args, **kwargs)
        out.sampled_token_ids = out.sampled_token_ids.flip(0)
        return out


class ExitInEveryGather(ReferenceSharder):
    """Rank 1 exits in gather whatever the batch: every case ends its launch the same way."""

    def gather_sampler_output(self, local_output, metadata, global_batch, local_batch, **kwargs):
        if self.rank == 1:
            os._exit(5)
        return super().gather_sampler_output(local_output, metadata, global_batch, local_batch, **kwargs)


class ExitOnRankZeroInAllToAll(ReferenceSharder):
    """Rank 0 exits before its all-to-all, whatever the batch: in a must-reject case its peer then loses it in
    that collective, before the step where the peer must raise; the peer is not to blame."""

    def all_to_all_logits(self, logits_shard, metadata):
        if self.rank == 0:
            sys.exit(3)
        return super().all_to_all_logits(logits_shard, metadata)


class DaemonInGather(_OnGather):
    """Starts a daemon (double fork, a session of its own) that outlives the rank, then behaves."""

    def attack(self) -> None:
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
                while True:
                    ctypes.CDLL(None).sleep(3600)
            os._exit(0)
        os.wait()


class DaemonThenRaiseInGather(DaemonInGather):
    """Starts a daemon, which holds a copy of every socket of the rank, then raises before its all-gather: the
    peer waiting there learns that the rank left only once nothing holds the rank's end of their connection."""

    def attack(self) -> None:
        super().attack()
        raise RuntimeError("deliberate failure after starting a daemon")


class ChildThenHangInGather(_OnGather):
    """Starts a child in a session of its own (it stays the rank's child), then never returns."""

    def attack(self) -> None:
        import subprocess

        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
        while True:
            time.sleep(1)


class SegfaultAfterReturning(ReferenceSharder):
    """A thread it leaves running crashes the rank a fraction of a second after the gather returned, while the
    rank waits for its peers (tests/conformance/test_unseen_collectives.py)."""

    def gather_sampler_output(self, *args, **kwargs):
        gathered = super().gather_sampler_output(*args, **kwargs)
        if self.rank == 1:

            def crash() -> None:
                import time

                time.sleep(0.3)
                ctypes.string_at(0)

            threading.Thread(target=crash, daemon=True).start()
        return gathered


class KillsItsParentThenDaemonInGather(DaemonInGather):
    """Kills the process that started it (the rank server, or torchrun), then starts a daemon: the daemon's
    parent is gone before the launch ends, so only the judge can still reach it."""

    def attack(self) -> None:
        os.kill(os.getppid(), signal.SIGKILL)
        super().attack()
