"""Observing a step: the collectives it issues, where it is, what it changed."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any, Optional

import numpy as np
import torch

from shardspec.conformance.checks.base import WireCall


class Progress:
    """Where a rank is right now; read by the watchdog from another thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self.case_id: Optional[str] = None
        self.step: Optional[str] = None
        self.collective: Optional[str] = None
        self.since = time.monotonic()

    def enter(self, case_id: Optional[str] = None, step: Optional[str] = None) -> None:
        with self._lock:
            if case_id is not None:
                self.case_id, self.since = case_id, time.monotonic()
            self.step, self.collective = step, None

    def set_collective(self, kind: Optional[str]) -> None:
        with self._lock:
            self.collective = kind

    def where(self) -> str:
        with self._lock:
            place = f"step {self.step}" if self.step else "between steps"
            if self.collective:
                place += f", inside {self.collective} (waiting for peers)"
            return place


class CollectiveError(RuntimeError):
    """Raised by a collective; often a consequence of a peer failing first."""


class RecordingComm:
    """A Communicator that clones every send buffer into a :class:`WireCall`.

    Exceptions raised inside a collective are re-raised as
    :class:`CollectiveError`, so a report can tell a rank's own failure from
    one caused by a peer that broke the group.
    """

    def __init__(self, comm, progress: Optional[Progress] = None):
        self.inner = comm
        self.rank = comm.rank
        self.world_size = comm.world_size
        self.group = getattr(comm, "group", None)
        self.calls: list[WireCall] = []
        self.progress = progress or Progress()
        self._inside = threading.local()

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes):
        self.calls.append(WireCall(
            kind="all_to_all_single", send=input.detach().clone(), output_shape=tuple(output.shape),
            output_split_sizes=[int(s) for s in output_split_sizes],
            input_split_sizes=[int(s) for s in input_split_sizes],
        ))
        self._run("all_to_all_single", self.inner.all_to_all_single, output, input,
                  output_split_sizes, input_split_sizes)

    def all_gather_into_tensor(self, output, input):
        self.calls.append(WireCall(
            kind="all_gather_into_tensor", send=input.detach().clone(), output_shape=tuple(output.shape),
        ))
        self._run("all_gather_into_tensor", self.inner.all_gather_into_tensor, output, input)

    def _run(self, kind: str, fn, *args, **kwargs):
        self.progress.set_collective(kind)
        self._inside.active = True
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise CollectiveError(f"{kind} failed on rank {self.rank}: {exc}") from exc
        finally:
            self._inside.active = False
            self.progress.set_collective(None)

    @contextlib.contextmanager
    def intercept_torch_distributed(self):
        """Also record collectives an implementation issues on ``comm.group`` itself.

        Implementations that call ``torch.distributed.all_to_all_single`` /
        ``all_gather_into_tensor`` / ``all_gather_single`` directly (looked up
        at call time) are recorded like calls through the Communicator. The
        functions are replaced once for all threads and route each call to the
        recorder of the calling thread, so ranks that are threads of one
        process record their own calls.
        """
        with _DIRECT_CALLS.routed_to(self):
            yield

    def record_direct(self, name: str, original, output, input, *args, **kwargs):
        """One direct ``torch.distributed`` call, recorded unless it is this recorder's own."""
        if getattr(self._inside, "active", False):
            return original(output, input, *args, **kwargs)  # already recorded by the Communicator
        kind = "all_to_all_single" if name == "all_to_all_single" else "all_gather_into_tensor"
        splits = dict(zip(("output_split_sizes", "input_split_sizes"), args))
        splits.update({k: kwargs[k] for k in ("output_split_sizes", "input_split_sizes") if k in kwargs})
        self.calls.append(WireCall(
            kind=kind, send=input.detach().clone(), output_shape=tuple(output.shape),
            output_split_sizes=_int_list(splits.get("output_split_sizes"), kind),
            input_split_sizes=_int_list(splits.get("input_split_sizes"), kind),
        ))
        return self._run(kind, original, output, input, *args, **kwargs)


class _DirectCalls:
    """torch.distributed's collectives replaced while any thread records; each call goes to its thread's recorder."""

    NAMES = ("all_to_all_single", "all_gather_into_tensor", "all_gather_single")

    def __init__(self):
        self._lock = threading.Lock()
        self._users = 0
        self._originals: dict = {}
        self._current = threading.local()

    @contextlib.contextmanager
    def routed_to(self, recorder: RecordingComm):
        self._acquire()
        self._current.recorder = recorder
        try:
            yield
        finally:
            self._current.recorder = None
            self._release()

    def _acquire(self) -> None:
        import torch.distributed as dist

        with self._lock:
            if self._users == 0:
                self._originals = {name: getattr(dist, name) for name in self.NAMES if hasattr(dist, name)}
                for name, original in self._originals.items():
                    setattr(dist, name, self._router(name, original))
            self._users += 1

    def _release(self) -> None:
        import torch.distributed as dist

        with self._lock:
            self._users -= 1
            if self._users == 0:
                for name, original in self._originals.items():
                    setattr(dist, name, original)

    def _router(self, name: str, original):
        def call(output, input, *args, **kwargs):
            recorder = getattr(self._current, "recorder", None)
            if recorder is None:  # a thread that records nothing
                return original(output, input, *args, **kwargs)
            return recorder.record_direct(name, original, output, input, *args, **kwargs)

        return call


_DIRECT_CALLS = _DirectCalls()


def _int_list(sizes, kind: str):
    if kind != "all_to_all_single":
        return None
    return None if sizes is None else [int(s) for s in sizes]


# -- snapshots of inputs (INV-INPUTS-UNCHANGED) -----------------------------

def snapshot(value: Any) -> Any:
    """A deep copy of tensors, arrays, lists, dataclasses and NamedTuples."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: snapshot(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {name: snapshot(getattr(value, name)) for name in value._fields}
    if isinstance(value, (list, tuple)):
        return [snapshot(v) for v in value]
    return value


def changed_fields(name: str, before: Any, value: Any) -> list[str]:
    """Names (``name.field``) whose contents differ from the snapshot ``before``."""
    if isinstance(before, dict):
        changed = []
        for key, old in before.items():
            changed += changed_fields(f"{name}.{key}", old, getattr(value, key, None))
        return changed
    if isinstance(before, list):
        if not isinstance(value, (list, tuple)) or len(value) != len(before):
            return [name]
        return [n for i, (b, v) in enumerate(zip(before, value)) for n in changed_fields(f"{name}[{i}]", b, v)]
    return [] if same_value(before, value) else [name]


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and same_tensor(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    return a == b


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and contents; NaN equals NaN."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b.to(a.device))


def run_lockstep(group, fn) -> list:
    """``fn(comm)`` on every rank of a LockstepGroup; per-rank results even if the group broke.

    ``fn`` records its own errors; a rank that leaves while peers wait makes
    them fail inside their collective, which ``fn`` records too.
    """
    results: list = [None] * group.world_size

    def body(rank: int) -> None:
        try:
            group.start(rank)
        except Exception:  # the group broke before this rank's turn
            pass
        try:
            results[rank] = fn(group.comm(rank))
        finally:
            group.finish(rank)

    threads = [threading.Thread(target=body, args=(rank,), daemon=True) for rank in range(group.world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(group.timeout_s * 2)
    if any(thread.is_alive() for thread in threads):
        raise TimeoutError(f"a rank did not finish within {group.timeout_s * 2:.0f}s")
    return results
