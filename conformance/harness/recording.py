"""The Communicator a step runs on, recording every collective the step issues (through it or around it)."""

from __future__ import annotations

import contextlib
import threading

from shardspec.conformance.harness.group_names import group_argument, group_label
from shardspec.conformance.harness.patching import DIRECT_CALLS, operator_calls
from shardspec.conformance.harness.progress import Progress
from shardspec.conformance.harness.wire_calls import SPEC_COLLECTIVES, generic_call, operator_call, spec_call
from shardspec.conformance.record import OFF_GROUP, WireCall


class CollectiveError(RuntimeError):
    """Raised by a collective; often a consequence of a peer failing first."""


class RecordingComm:
    """A Communicator that clones every send buffer into a :class:`WireCall`.

    Exceptions raised inside a collective are re-raised as
    :class:`CollectiveError`, so a report can tell a rank's own failure from
    one caused by a peer that broke the group.
    """

    def __init__(self, comm, progress: Progress | None = None):
        self.inner = comm
        self.rank = comm.rank
        self.world_size = comm.world_size
        self.group = getattr(comm, "group", None)
        self.calls: list[WireCall] = []
        self.progress = progress or Progress()
        self._inside = threading.local()

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes):
        self.calls.append(
            WireCall(
                kind="all_to_all_single",
                send=input.detach().clone(),
                output_shape=tuple(output.shape),
                output_split_sizes=[int(s) for s in output_split_sizes],
                input_split_sizes=[int(s) for s in input_split_sizes],
            )
        )
        self._run(
            "all_to_all_single", self.inner.all_to_all_single, output, input, output_split_sizes, input_split_sizes
        )

    def all_gather_into_tensor(self, output, input):
        self.calls.append(
            WireCall(
                kind="all_gather_into_tensor",
                send=input.detach().clone(),
                output_shape=tuple(output.shape),
            )
        )
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

    def __getattr__(self, name: str):
        """Any other attribute of the wrapped Communicator; calls to its methods are recorded too.

        A Communicator only promises the two collectives above, but an
        implementation written against a richer one (a barrier, an
        all-reduce) must not slip past INV-WIRE-SEQUENCE by calling it.
        """
        attribute = getattr(self.inner, name)
        if name.startswith("__") or not callable(attribute):
            return attribute

        def recorded(*args, **kwargs):
            self.calls.append(generic_call(name, args, kwargs))
            return self._run(name, attribute, *args, **kwargs)

        return recorded

    @contextlib.contextmanager
    def intercept_torch_distributed(self):
        """Also record what an implementation issues through ``torch.distributed`` itself.

        Every collective and point-to-point function of ``torch.distributed``
        (:data:`DIRECT_FUNCTIONS`), looked up at call time on
        ``torch.distributed`` or ``torch.distributed.distributed_c10d``, is
        recorded like a call through the Communicator. The functions are
        replaced once for all threads and route each call to the recorder of
        the calling thread, so ranks that are threads of one process record
        their own calls. Calls made inside a recorded one (torch's own helpers,
        the Communicator's own use of torch.distributed) are not recorded again.

        Below those functions, every collective operator the dispatcher runs on
        this thread (:data:`OPERATOR_NAMESPACES`: functional collectives such
        as ``torch.distributed._functional_collectives.all_reduce``, whatever
        wraps them, and the ``c10d`` operators a process group issues, e.g.
        through a torch.distributed function captured before recording began)
        is recorded too, by a dispatch mode (:func:`operator_calls`).

        Each call keeps the group it ran on (:meth:`on_group`).
        """
        with DIRECT_CALLS.routed_to(self), operator_calls(self):
            yield

    def record_direct(self, name: str, original, args: tuple, kwargs: dict):
        """One direct ``torch.distributed`` call, recorded unless it happens inside a recorded one."""
        if getattr(self._inside, "active", False):
            return original(*args, **kwargs)
        if name in SPEC_COLLECTIVES:
            call = spec_call(SPEC_COLLECTIVES[name], args, kwargs)
        else:
            call = generic_call(name, args, kwargs)
        call.kind = self.on_group(call.kind, group_argument(name, original, args, kwargs))
        self.calls.append(call)
        return self._run(call.kind, original, *args, **kwargs)

    def record_op(self, func, args: tuple, kwargs: dict):
        """One collective operator (``torch.ops._c10d_functional.*``, ``torch.ops.c10d.*``, ...) seen by
        :func:`operator_calls`, recorded unless it happens inside a recorded call."""
        if getattr(self._inside, "active", False):
            return func(*args, **kwargs)
        call, group = operator_call(func, args, kwargs)
        call.kind = self.on_group(call.kind, group)
        self.calls.append(call)
        return self._run(call.kind, func, *args, **kwargs)

    def on_group(self, kind: str, group) -> str:
        """``kind`` for a call on the step's TP group (this Communicator's); ``"<kind> on <that group>"`` for
        any other (the default group of a world holding several TP groups, a group of its own), which
        INV-WIRE-SEQUENCE fails, naming the group. ``group`` None is the default group."""
        label = group_label(group, self.group)
        return kind if label is None else f"{kind}{OFF_GROUP}{label}"
