"""torch.distributed patched while a step records: its functions and process-group methods routed to
the calling thread's recorder, and a dispatch mode seeing the collective operators below them."""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any

from shardspec.conformance.harness.wire_calls import (
    DIRECT_FUNCTIONS,
    GROUP_METHODS,
    LOCAL_OPERATORS,
    OPERATOR_NAMESPACES,
    operator_name,
)

if TYPE_CHECKING:
    from shardspec.conformance.harness.recording import RecordingComm


class DirectCalls:
    """torch.distributed's functions replaced while any thread records; each call goes to its thread's recorder."""

    def __init__(self):
        self._lock = threading.Lock()
        self._users = 0
        self._originals: dict = {}
        self._current = threading.local()

    @contextlib.contextmanager
    def routed_to(self, recorder: RecordingComm):
        self._acquire(type(getattr(recorder, "group", None)))
        self._current.recorder = recorder
        try:
            yield
        finally:
            self._current.recorder = None
            self._release()

    @staticmethod
    def _namespaces() -> list:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        return [dist, c10d]

    @staticmethod
    def _targets(group_class) -> list[tuple[Any, str, str]]:
        """(owner, attribute, recorded name) of every function and process-group method to record: the
        methods of ProcessGroup and of the run's group class and its bases that override them (torch's
        threaded backend does)."""
        import torch.distributed as dist

        targets = [(module, name, name) for module in DirectCalls._namespaces() for name in DIRECT_FUNCTIONS]
        base = getattr(dist, "ProcessGroup", None)
        classes = [base] if base is not None else []
        if base is not None and isinstance(group_class, type) and issubclass(group_class, base):
            classes += [c for c in group_class.__mro__ if c is not base and issubclass(c, base)]
        for cls in classes:
            own = [name for name in GROUP_METHODS if name in vars(cls)] if cls is not base else GROUP_METHODS
            targets += [(cls, name, f"ProcessGroup.{name}") for name in own]
        return [(owner, name, recorded) for owner, name, recorded in targets if hasattr(owner, name)]

    def _acquire(self, group_class=None) -> None:
        with self._lock:
            if self._users == 0:
                self._originals = {}
            for owner, name, recorded in self._targets(group_class):
                if (owner, name) not in self._originals:
                    original = vars(owner).get(name, getattr(owner, name))
                    self._originals[(owner, name)] = original
                    setattr(owner, name, self._router(recorded, original))
            self._users += 1

    def _release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                for (module, name), original in self._originals.items():
                    setattr(module, name, original)

    def _router(self, name: str, original):
        def call(*args, **kwargs):
            recorder = getattr(self._current, "recorder", None)
            if recorder is None:  # a thread that records nothing
                return original(*args, **kwargs)
            return recorder.record_direct(name, original, args, kwargs)

        return call


DIRECT_CALLS = DirectCalls()


def operator_calls(recorder: RecordingComm):
    """A dispatch mode recording, on this thread, every collective operator that runs under it.

    Dispatch modes are per thread, so each rank of a threaded group records its own operators; an
    operator issued inside a recorded call (a torch.distributed function's own c10d operator) is not
    recorded again.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class OperatorCalls(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            namespace, op = operator_name(func)
            if namespace in OPERATOR_NAMESPACES and op not in LOCAL_OPERATORS:
                return recorder.record_op(func, args, kwargs)
            return func(*args, **kwargs)

    return OperatorCalls()
