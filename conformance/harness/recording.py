"""The Communicator a step runs on, recording every collective the step issues (through it or around it)."""

from __future__ import annotations

import contextlib
import threading

from shardspec.conformance.harness.group_names import group_argument, placement
from shardspec.conformance.harness.patching import DIRECT_CALLS, STARTED_THREADS, operator_calls
from shardspec.conformance.harness.progress import Progress
from shardspec.conformance.harness.wire_calls import (
    METHOD_SPEC_CALLS,
    SPEC_COLLECTIVES,
    generic_call,
    operator_call,
    spec_call,
)
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
        self.adopted: list[threading.Thread] = []  # threads the step started (patching.StartedThreads)

    def adopt(self, thread: threading.Thread) -> None:
        self.adopted = [t for t in self.adopted if t.is_alive()] + [thread]

    @contextlib.contextmanager
    def start_up(self):
        """The engine's start-up inside a constructor (:func:`shardspec.comm.start_up`): its collectives on this
        thread are not recorded. Only while the sharder is constructed; elsewhere a step's collectives all count."""
        if self.progress.step != "construct":
            yield
            return
        before = getattr(self._inside, "active", False)
        self._inside.active = True
        try:
            with STARTED_THREADS.not_recorded():  # nor the threads it starts (a broadcaster of the engine's)
                yield
        finally:
            self._inside.active = before

    def observe_communicator(self, communicator, name: str = "engine communicator"):
        """``communicator`` (an engine's own, such as vLLM's PyNccl communicator) as a proxy whose every method
        call is recorded like a collective of this rank on the TP group (:class:`ObservedCommunicator`).
        Reached through :func:`shardspec.comm.observed`, which an adapter calls with the Communicator the suite
        gave it."""
        return ObservedCommunicator(self, communicator, name)

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
        method = name.partition(".")[2] if name.startswith(("ProcessGroup.", "Backend.")) else None
        if name in SPEC_COLLECTIVES:
            call = spec_call(SPEC_COLLECTIVES[name], args, kwargs)
        elif method in METHOD_SPEC_CALLS:  # the object is the first argument
            call = spec_call(METHOD_SPEC_CALLS[method], args[1:], _function_keywords(kwargs))
        else:
            call = generic_call(name, args, kwargs)
        self.on_group(call, group_argument(name, original, args, kwargs))
        self.calls.append(call)
        return self._run(call.kind, original, *args, **kwargs)

    def record_op(self, func, args: tuple, kwargs: dict):
        """One collective operator (``torch.ops._c10d_functional.*``, ``torch.ops.c10d.*``, ...) seen by
        :func:`operator_calls`, recorded unless it happens inside a recorded call."""
        if getattr(self._inside, "active", False):
            return func(*args, **kwargs)
        call, group = operator_call(func, args, kwargs)
        self.on_group(call, group)
        self.calls.append(call)
        return self._run(call.kind, func, *args, **kwargs)

    def on_group(self, call: WireCall, group) -> None:
        """Marks ``call`` with the group it ran on: its kind unchanged for the step's TP group (this
        Communicator's), ``"<kind> on <that group>"`` for any other (the default group of a world holding
        several TP groups, a group of other ranks, a backend no known group holds), which INV-WIRE-SEQUENCE
        fails, naming the group; ``call.group`` names a group of exactly the TP group's ranks that the
        implementation built (:func:`placement`). ``group`` None is the default group."""
        label, own = placement(group, self.group)
        if label is not None:
            call.kind = f"{call.kind}{OFF_GROUP}{label}"
        call.group = own


# An engine communicator's methods that carry the step's own collectives, as (spec call, its argument order):
# vLLM's PyNcclCommunicator.all_to_all_single(output, input, output_split_sizes, input_split_sizes) and
# all_gather(output, input).
ENGINE_SPEC_CALLS = {"all_to_all_single": "all_to_all_single", "all_gather": "all_gather_into_tensor"}
ENGINE_SPEC_CALLS["all_gather_into_tensor"] = "all_gather_into_tensor"


class ObservedCommunicator:
    """An engine's own communicator seen by the recorder: every method call is a collective of the step.

    ``all_to_all_single`` and ``all_gather`` (``all_gather_into_tensor``) are recorded as the spec's calls, with
    their send buffers, so the wire checks judge them; any other method (``send``, ``recv``, ``all_reduce``,
    ``group_start``, ...) is recorded by its name, ``"<name> (engine communicator)"``, which INV-WIRE-SEQUENCE
    fails. What the communicator does inside a recorded call (its grouped send/recv, a torch.distributed
    fallback) is not recorded again. Attributes that are not methods pass through.
    """

    def __init__(self, recorder: RecordingComm, communicator, name: str):
        self._recorder, self._inner, self._name = recorder, communicator, name

    def __getattr__(self, attribute: str):
        value = getattr(self._inner, attribute)
        if attribute.startswith("_") or not callable(value):
            return value
        recorder, name = self._recorder, self._name

        def recorded(*args, **kwargs):
            if getattr(recorder._inside, "active", False):
                return value(*args, **kwargs)
            if attribute in ENGINE_SPEC_CALLS:
                call = spec_call(ENGINE_SPEC_CALLS[attribute], args, _function_keywords(kwargs))
            else:
                call = generic_call(attribute, args, kwargs)
                call.kind = f"{attribute} ({name})"
            recorder.calls.append(call)
            return recorder._run(call.kind, value, *args, **kwargs)

        return recorded


def _function_keywords(kwargs: dict) -> dict:
    """A method's keywords (``output``, ``input``: an engine communicator's, a process group's) as
    torch.distributed's functions name them (``output_tensor``, ``input_tensor``)."""
    renamed = {"output": "output_tensor", "input": "input_tensor"}
    return {renamed.get(key, key): value for key, value in kwargs.items()}
