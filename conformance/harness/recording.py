"""Observing a step: the collectives it issues, where it is, what it changed."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from shardspec.conformance.record import OFF_GROUP, WireCall


class Progress:
    """Where a rank is right now; read by the watchdog from another thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self.case_id: str | None = None
        self.step: str | None = None
        self.collective: str | None = None
        self.since = time.monotonic()

    def enter(self, case_id: str | None = None, step: str | None = None) -> None:
        with self._lock:
            if case_id is not None:
                self.case_id, self.since = case_id, time.monotonic()
            self.step, self.collective = step, None

    def set_collective(self, kind: str | None) -> None:
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
        is recorded too, by a dispatch mode (:func:`_operator_calls`).

        Each call keeps the group it ran on (:meth:`on_group`).
        """
        with _DIRECT_CALLS.routed_to(self), _operator_calls(self):
            yield

    def record_direct(self, name: str, original, args: tuple, kwargs: dict):
        """One direct ``torch.distributed`` call, recorded unless it happens inside a recorded one."""
        if getattr(self._inside, "active", False):
            return original(*args, **kwargs)
        if name in SPEC_COLLECTIVES:
            call = _spec_call(SPEC_COLLECTIVES[name], args, kwargs)
        else:
            call = generic_call(name, args, kwargs)
        call.kind = self.on_group(call.kind, _group_argument(name, original, args, kwargs))
        self.calls.append(call)
        return self._run(call.kind, original, *args, **kwargs)

    def record_op(self, func, args: tuple, kwargs: dict):
        """One collective operator (``torch.ops._c10d_functional.*``, ``torch.ops.c10d.*``, ...) seen by
        :func:`_operator_calls`, recorded unless it happens inside a recorded call."""
        if getattr(self._inside, "active", False):
            return func(*args, **kwargs)
        call, group = _operator_call(func, args, kwargs)
        call.kind = self.on_group(call.kind, group)
        self.calls.append(call)
        return self._run(call.kind, func, *args, **kwargs)

    def on_group(self, kind: str, group) -> str:
        """``kind`` for a call on the step's TP group (this Communicator's); ``"<kind> on <that group>"`` for
        any other (the default group of a world holding several TP groups, a group of its own), which
        INV-WIRE-SEQUENCE fails, naming the group. ``group`` None is the default group."""
        label = group_label(group, self.group)
        return kind if label is None else f"{kind}{OFF_GROUP}{label}"


# The step's own collectives (INV-WIRE-SEQUENCE), by the names torch.distributed gives them.
SPEC_COLLECTIVES = {
    "all_to_all_single": "all_to_all_single",
    "all_gather_into_tensor": "all_gather_into_tensor",
    "all_gather_single": "all_gather_into_tensor",
}
# Every other torch.distributed function that talks to peers.
OTHER_FUNCTIONS = (
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "send_object_list",
    "recv_object_list",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_object",
    "_all_gather_base",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "all_to_all",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
)
DIRECT_FUNCTIONS = tuple(SPEC_COLLECTIVES) + OTHER_FUNCTIONS
# The methods of the process-group object that talk to peers: an implementation holding the group can
# call them without torch.distributed's functions (group.barrier().wait()). Recorded as
# "ProcessGroup.<name>"; torch.distributed's own calls of them happen inside a recorded call.
GROUP_METHODS = (
    "allreduce",
    "allreduce_coalesced",
    "reduce",
    "broadcast",
    "allgather",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "_allgather_base",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor_coalesced",
    "_reduce_scatter_base",
    "alltoall",
    "alltoall_base",
    "send",
    "recv",
    "recv_anysource",
    "barrier",
    "monitored_barrier",
)
# The argument (position, keyword) holding what a function sends; the others send nothing of their own
# (barrier, recv) or objects rather than tensors.
SENT_ARGUMENT = {
    "all_reduce": (0, "tensor"),
    "reduce": (0, "tensor"),
    "broadcast": (0, "tensor"),
    "send": (0, "tensor"),
    "isend": (0, "tensor"),
    "gather": (0, "tensor"),
    "all_gather": (1, "tensor"),
    "all_gather_coalesced": (1, "input_tensor_list"),
    "_all_gather_base": (1, "input_tensor"),
    "all_reduce_coalesced": (0, "tensors"),
    "reduce_scatter": (1, "input_list"),
    "reduce_scatter_tensor": (1, "input"),
    "_reduce_scatter_base": (1, "input"),
    "all_to_all": (1, "input_tensor_list"),
    "scatter": (1, "scatter_list"),
}


def _argument(args: tuple, kwargs: dict, position: int, keyword: str):
    return args[position] if len(args) > position else kwargs.get(keyword)


def _spec_call(kind: str, args: tuple, kwargs: dict) -> WireCall:
    output, input = _argument(args, kwargs, 0, "output_tensor"), _argument(args, kwargs, 1, "input_tensor")
    if output is None:
        output, input = kwargs.get("output"), kwargs.get("input")
    splits = {"output_split_sizes": None, "input_split_sizes": None}
    if kind == "all_to_all_single":
        splits = {
            name: _argument(args, kwargs, position, name)
            for position, name in ((2, "output_split_sizes"), (3, "input_split_sizes"))
        }
    return WireCall(
        kind=kind,
        send=_clone(input),
        output_shape=_shape(output),
        output_split_sizes=_int_list(splits["output_split_sizes"]),
        input_split_sizes=_int_list(splits["input_split_sizes"]),
    )


def generic_call(name: str, args: tuple, kwargs: dict) -> WireCall:
    """A call outside the step's sequence: its name, what it sends and the shape of its first argument."""
    sent = _argument(args, kwargs, *SENT_ARGUMENT[name]) if name in SENT_ARGUMENT else None
    first = args[0] if args else None
    return WireCall(kind=name, send=_clone(sent), output_shape=_shape(first))


def _clone(value) -> torch.Tensor:
    """A copy of a sent tensor (lists of tensors flattened into one); empty when nothing is sent."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    tensors = [v for v in value if isinstance(v, torch.Tensor)] if isinstance(value, (list, tuple)) else []
    if tensors and len({t.dtype for t in tensors}) == 1:
        return torch.cat([t.detach().reshape(-1) for t in tensors])
    return torch.empty(0)


def _shape(value) -> tuple:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else ()


class _DirectCalls:
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

        targets = [(module, name, name) for module in _DirectCalls._namespaces() for name in DIRECT_FUNCTIONS]
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


_DIRECT_CALLS = _DirectCalls()


# -- the group a call ran on -------------------------------------------------

_UNNAMED = object()  # a call whose group the recorder cannot tell
_SIGNATURES: dict = {}


def _group_argument(name: str, original, args: tuple, kwargs: dict):
    """The group a torch.distributed function or process-group method was called on; None: the default one."""
    if name.startswith("ProcessGroup."):
        return args[0] if args else _UNNAMED
    if name == "batch_isend_irecv":
        ops = _argument(args, kwargs, 0, "p2p_op_list") or []
        return getattr(ops[0], "group", None) if ops else None
    if "group" in kwargs:
        return kwargs["group"]
    import inspect

    try:
        if original not in _SIGNATURES:
            _SIGNATURES[original] = inspect.signature(original)
        bound = _SIGNATURES[original].bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):  # a call torch itself will refuse; its group does not matter then
        return None
    return bound.get("group")


def group_label(group, tp_group) -> str | None:
    """None for the TP group (``tp_group``; also the default group where it is the TP group); otherwise the
    group in words, by its world ranks: ``the default group (world ranks [0, 1, 2, 3])``, ``a group of world
    ranks [2, 3]``. ``group`` is a ProcessGroup, a group name (as functional collectives pass it) or None
    (the default group)."""
    if tp_group is None:
        return None  # no torch.distributed group to compare with (a Communicator of its own)
    import torch.distributed.distributed_c10d as c10d

    if group is _UNNAMED:
        return "a group the recorder cannot name"
    if isinstance(group, str):
        try:
            group = c10d._resolve_process_group(group)
        except Exception:
            return f"group {group!r}, which this process does not know"
    default = c10d._get_default_group() if c10d.is_initialized() else None
    group = default if group is None else group
    if group is tp_group or (_group_name(group) is not None and _group_name(group) == _group_name(tp_group)):
        return None
    ranks = _world_ranks(group)
    if group is default or (_group_name(group) is not None and _group_name(group) == _group_name(default)):
        return f"the default group (world ranks {ranks})"
    if ranks is not None and ranks == _world_ranks(tp_group):
        return f"a group of world ranks {ranks} that is not the TP group (of the same ranks)"
    return f"a group of world ranks {ranks}" if ranks is not None else f"group {_group_name(group)!r}"


def _group_name(group) -> str | None:
    try:
        return str(group.group_name) or None
    except Exception:
        return None


def _world_ranks(group) -> list[int] | None:
    import torch.distributed as dist

    try:
        return [int(r) for r in dist.get_process_group_ranks(group)]
    except Exception:
        return None


# -- collective operators (functional collectives and what process groups dispatch) -----

# The operator namespaces of collectives: functional collectives (and their autograd variants), the
# c10d operators every C++ process group's collectives dispatch to, DTensor's and symmetric memory's.
OPERATOR_NAMESPACES = (
    "_c10d_functional",
    "_c10d_functional_autograd",
    "c10d_functional",
    "c10d",
    "_dtensor",
    "symm_mem",
)
# Operators of those namespaces that do not talk to peers.
LOCAL_OPERATORS = ("wait_tensor", "_wrap_tensor_autograd", "check_for_nan", "memset32_", "stream_write_value32_")
# Operators carrying the step's own collectives: recorded under the spec's names (a step may issue its
# all-to-all or all-gather as a functional collective, or through the process group it holds).
_OPERATOR_SPEC_CALLS = {
    ("_c10d_functional", "all_to_all_single"): "all_to_all_single",
    ("_c10d_functional_autograd", "all_to_all_single"): "all_to_all_single",
    ("c10d", "alltoall_base_"): "all_to_all_single",
    ("_c10d_functional", "all_gather_into_tensor"): "all_gather_into_tensor",
    ("_c10d_functional", "all_gather_into_tensor_out"): "all_gather_into_tensor",
    ("_c10d_functional_autograd", "all_gather_into_tensor"): "all_gather_into_tensor",
    ("c10d", "_allgather_base_"): "all_gather_into_tensor",
}
_SENT_NAMES = ("input", "inputs", "input_tensor", "input_tensors", "input_list")
_SENDS_ITS_TENSORS = ("allreduce_", "allreduce_coalesced_", "broadcast_", "reduce_", "send", "isend", "batch_p2p_ops")


def _operator_name(func) -> tuple[str | None, str]:
    schema = getattr(func, "_schema", None)
    name = schema.name if schema is not None else str(func)
    return getattr(func, "namespace", None), name.split("::")[-1]


def _flat(value):
    """A list of lists of tensors as one list (c10d's Tensor[][] arguments)."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (list, tuple)) for v in value):
        return [t for v in value for t in v]
    return value


def _operator_call(func, args: tuple, kwargs: dict) -> tuple[WireCall, Any]:
    """(the call, the group it runs on) of one collective operator, from its schema's argument names."""
    namespace, op = _operator_name(func)
    names = [argument.name for argument in func._schema.arguments]
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    group = bound["group_name"] if "group_name" in bound else _UNNAMED
    if "process_group" in bound:
        group = _unboxed(bound["process_group"])
    spec = _OPERATOR_SPEC_CALLS.get((namespace, op))
    if spec == "all_to_all_single":
        send = bound.get("input")
        out_splits, in_splits = _int_list(bound.get("output_split_sizes")), _int_list(bound.get("input_split_sizes"))
        output = bound.get("output")
        if output is None:  # functional: allocated by the operator
            rows = sum(out_splits) if out_splits else int(send.shape[0])
            shape = (rows, *send.shape[1:])
        else:
            shape = _shape(output)
        call = WireCall(spec, _clone(send), shape, output_split_sizes=out_splits, input_split_sizes=in_splits)
        return call, group
    if spec == "all_gather_into_tensor":
        send = bound.get("input", bound.get("input_tensor"))
        output = bound.get("out", bound.get("output_tensor"))
        if output is None:
            shape = (int(bound.get("group_size", 1)) * int(send.shape[0]), *send.shape[1:])
        else:
            shape = _shape(output)
        return WireCall(spec, _clone(send), shape), group
    sent = next((bound[name] for name in _SENT_NAMES if name in bound), None)
    if sent is None and op in _SENDS_ITS_TENSORS:
        sent = bound.get("tensors", bound.get("tensor"))
    first = args[0] if args else None
    return WireCall(f"{namespace}.{op}", _clone(_flat(sent)), _shape(first)), group


def _unboxed(process_group):
    """The ProcessGroup of a c10d operator's argument (a TorchScript object there)."""
    import torch.distributed as dist

    if isinstance(process_group, dist.ProcessGroup):
        return process_group
    try:
        return dist.ProcessGroup.unbox(process_group)
    except Exception:
        return _UNNAMED


def _operator_calls(recorder: RecordingComm):
    """A dispatch mode recording, on this thread, every collective operator that runs under it.

    Dispatch modes are per thread, so each rank of a threaded group records its own operators; an
    operator issued inside a recorded call (a torch.distributed function's own c10d operator) is not
    recorded again.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class OperatorCalls(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            namespace, op = _operator_name(func)
            if namespace in OPERATOR_NAMESPACES and op not in LOCAL_OPERATORS:
                return recorder.record_op(func, args, kwargs)
            return func(*args, **kwargs)

    return OperatorCalls()


def _int_list(sizes):
    return None if sizes is None else [int(s) for s in sizes]


# -- snapshots of inputs (INV-INPUTS-UNCHANGED) -----------------------------


def _children(value: Any) -> dict[str, Any] | list[Any] | None:
    """The fields of a dataclass, NamedTuple or dict by name, the items of a list or tuple; None for a leaf."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {name: getattr(value, name) for name in value._fields}
    if isinstance(value, dict):  # e.g. a sampler output's extension fields
        return dict(value)
    if isinstance(value, (list, tuple)):
        return list(value)
    return None


def snapshot(value: Any) -> Any:
    """A deep copy of tensors, arrays, lists, dataclasses and NamedTuples (these two as dicts)."""
    children = _children(value)
    if isinstance(children, dict):
        return {key: snapshot(item) for key, item in children.items()}
    if isinstance(children, list):
        return [snapshot(item) for item in children]
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    return value


def tensors(name: str, value: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(``name.field``, tensor) for every tensor in ``value``, named as :func:`changed_fields` names them."""
    children = _children(value)
    if isinstance(children, dict):
        for key, item in children.items():
            yield from tensors(f"{name}.{key}", item)
    elif isinstance(children, list):
        for i, item in enumerate(children):
            yield from tensors(f"{name}[{i}]", item)
    elif isinstance(value, torch.Tensor):
        yield name, value


def changed_fields(name: str, before: Any, value: Any) -> list[str]:
    """Names (``name.field``) whose contents differ from the snapshot ``before``."""
    return [n for n, b, v in leaves(name, before, value) if not same_value(b, v)]


def leaves(name: str, before: Any, value: Any) -> Iterator[tuple[str, Any, Any]]:
    """(``name.field``, snapshot leaf, current leaf) for each leaf of the snapshot ``before``; a list whose
    length changed is one leaf."""
    if isinstance(before, dict):
        for key, old in before.items():
            item = value.get(key) if isinstance(value, dict) else getattr(value, key, None)
            yield from leaves(f"{name}.{key}", old, item)
    elif isinstance(before, list) and isinstance(value, (list, tuple)) and len(value) == len(before):
        for i, (b, v) in enumerate(zip(before, value, strict=True)):
            yield from leaves(f"{name}[{i}]", b, v)
    else:
        yield name, before, value


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
