"""torch.distributed patched while a step records: its functions, process-group methods and backend methods
routed to the calling thread's recorder, a dispatch mode seeing the collective operators below them, and every
thread a recording thread starts recording to the same recorder."""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.utils._python_dispatch import TorchDispatchMode

from shardspec.conformance.harness.wire_calls import (
    BACKEND_METHODS,
    DIRECT_FUNCTIONS,
    GROUP_METHODS,
    LOCAL_OPERATORS,
    OPERATOR_NAMESPACES,
    operator_name,
)

try:
    from torch._C._distributed_c10d import Backend
except ImportError:  # a torch built without distributed support
    Backend = None

if TYPE_CHECKING:
    from shardspec.conformance.harness.recording import RecordingComm


_UNSET = object()


class DirectCalls:
    """torch.distributed's functions replaced while any thread records; each call goes to its thread's recorder.

    A thread that never recorded (one started before the step, outside the recording threads) is the rank's
    where one recorder alone is active in the process (a multi-process run: one rank per process); where
    several are (ranks that are threads of one process), it cannot be told which rank it belongs to."""

    def __init__(self):
        self._lock = threading.Lock()
        self._users = 0
        self._originals: dict = {}
        self._current = threading.local()
        self._active: list = []  # one entry per hold of the patches: the recorder holding them

    @contextlib.contextmanager
    def routed_to(self, recorder: RecordingComm):
        self._acquire(type(getattr(recorder, "group", None)), recorder)
        self._current.recorder = recorder
        try:
            yield
        finally:
            self._current.recorder = None  # this thread records no more (its harness work after the step)
            self._release(recorder)

    def held_for(self, recorder: RecordingComm):
        """Keeps the patches in place after the step returned, for the threads it left running: returns the
        function that lets them go (once the step's results are handed back)."""
        self._acquire(type(getattr(recorder, "group", None)), recorder)
        released = []

        def release() -> None:
            if not released:
                released.append(True)
                self._release(recorder)

        return release

    def on_this_thread(self, recorder: RecordingComm | None) -> None:
        self._current.recorder = recorder

    def recorder_here(self):
        current = getattr(self._current, "recorder", _UNSET)
        if current is not _UNSET:
            return current
        with self._lock:
            holders = {id(r): r for r in self._active}
        return next(iter(holders.values())) if len(holders) == 1 else None

    @staticmethod
    def _namespaces() -> list:
        return [dist, c10d]

    @staticmethod
    def _targets(group_class) -> list[tuple[Any, str, str]]:
        """(owner, attribute, recorded name) of every function and process-group method to record: the
        methods of ProcessGroup and of the run's group class and its bases that override them (torch's
        threaded backend does)."""
        targets = [(module, name, name) for module in DirectCalls._namespaces() for name in DIRECT_FUNCTIONS]
        base = getattr(dist, "ProcessGroup", None)
        classes = [base] if base is not None else []
        if base is not None and isinstance(group_class, type) and issubclass(group_class, base):
            classes += [c for c in group_class.__mro__ if c is not base and issubclass(c, base)]
        for cls in classes:
            own = [name for name in GROUP_METHODS if name in vars(cls)] if cls is not base else GROUP_METHODS
            targets += [(cls, name, f"ProcessGroup.{name}") for name in own]
        for cls in _backend_classes():
            own = [name for name in BACKEND_METHODS if name in vars(cls)]
            targets += [(cls, name, f"Backend.{name}") for name in own]
        return [(owner, name, recorded) for owner, name, recorded in targets if hasattr(owner, name)]

    def _acquire(self, group_class=None, recorder=None) -> None:
        with self._lock:
            if self._users == 0:
                self._originals = {}
            for owner, name, recorded in self._targets(group_class):
                if (owner, name) not in self._originals:
                    original = vars(owner).get(name, getattr(owner, name))
                    self._originals[(owner, name)] = original
                    setattr(owner, name, self._router(recorded, original))
            self._users += 1
            self._active.append(recorder)

    def _release(self, recorder=None) -> None:
        with self._lock:
            self._users -= 1
            self._active.remove(recorder)
            if self._users == 0:
                for (module, name), original in self._originals.items():
                    setattr(module, name, original)

    def _router(self, name: str, original):
        def call(*args, **kwargs):
            recorder = self.recorder_here()
            if recorder is None:  # a thread that records nothing
                return original(*args, **kwargs)
            return recorder.record_direct(name, original, args, kwargs)

        return call


def _backend_classes() -> list:
    """torch's C++ backend class and its subclasses (ProcessGroupGloo, ProcessGroupNCCL, ...): their methods
    are what a caller holding a backend object calls."""
    if Backend is None:
        return []
    classes, todo = [], [Backend]
    while todo:
        cls = todo.pop()
        if cls not in classes:
            classes.append(cls)
            todo += cls.__subclasses__()
    return classes


DIRECT_CALLS = DirectCalls()


class StartedThreads:
    """``threading.Thread.start`` replaced while any thread records: a thread started by a recording thread
    records to the same recorder (torch.distributed's functions and, through its own dispatch mode, the
    collective operators), and the recorder keeps it (:meth:`RecordingComm.adopt`) so that the step's
    results are watched until it ends."""

    def __init__(self):
        self._lock = threading.Lock()
        self._users = 0
        self._original = None
        self._recorders = threading.local()

    @contextlib.contextmanager
    def adopted_by(self, recorder: RecordingComm):
        with self._started_as(recorder):
            yield

    @contextlib.contextmanager
    def not_recorded(self):
        """Threads this thread starts meanwhile record nothing, now or later (an engine's start-up)."""
        with self._started_as(NOT_RECORDED):
            yield

    @contextlib.contextmanager
    def _started_as(self, recorder):
        with self._lock:
            if self._users == 0:
                self._original = threading.Thread.start
                threading.Thread.start = self._start
            self._users += 1
        previous = getattr(self._recorders, "recorder", None)
        self._recorders.recorder = recorder
        try:
            yield
        finally:
            self._recorders.recorder = previous
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    threading.Thread.start = self._original

    @property
    def _start(self):
        started = self

        def start(thread, *args, **kwargs):
            recorder = getattr(started._recorders, "recorder", None)
            if recorder is NOT_RECORDED:
                thread.run = _not_recording(thread.run)
            elif recorder is not None:
                recorder.adopt(thread)
                thread.run = _recording(thread.run, recorder, started)
            return started._original(thread, *args, **kwargs)

        return start


NOT_RECORDED = object()


def _not_recording(run):
    def unrecorded() -> None:
        DIRECT_CALLS.on_this_thread(None)  # not even as the process's one rank
        run()

    return unrecorded


def _recording(run, recorder: RecordingComm, started: StartedThreads):
    def recorded() -> None:
        started._recorders.recorder = recorder  # and the threads this one starts
        DIRECT_CALLS.on_this_thread(recorder)
        try:
            with operator_calls(recorder) if recorder.group is not None else contextlib.nullcontext():
                run()
        finally:
            DIRECT_CALLS.on_this_thread(None)
            started._recorders.recorder = None

    return recorded


STARTED_THREADS = StartedThreads()


def operator_calls(recorder: RecordingComm):
    """A dispatch mode recording, on this thread, every collective operator that runs under it.

    Dispatch modes are per thread, so each rank of a threaded group records its own operators; an
    operator issued inside a recorded call (a torch.distributed function's own c10d operator) is not
    recorded again.
    """

    class OperatorCalls(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            namespace, op = operator_name(func)
            if namespace in OPERATOR_NAMESPACES and op not in LOCAL_OPERATORS:
                return recorder.record_op(func, args, kwargs)
            return func(*args, **kwargs)

    return OperatorCalls()
