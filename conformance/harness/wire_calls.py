"""A collective call turned into a :class:`WireCall`: a torch.distributed function or process-group
method by its arguments, a collective operator by its schema."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from shardspec.conformance.harness.group_names import UNNAMED
from shardspec.conformance.record import WireCall

# The step's own collectives (INV-WIRE-SEQUENCE), by the names torch.distributed gives them.
SPEC_COLLECTIVES = {
    "all_to_all_single": "all_to_all_single",
    "all_gather_into_tensor": "all_gather_into_tensor",
    "all_gather_single": "all_gather_into_tensor",
}
# The methods of a process group or backend object that carry the step's own collectives (the object is their
# first argument): output, input (and the split sizes), as torch.distributed's functions take them.
METHOD_SPEC_CALLS = {"alltoall_base": "all_to_all_single", "_allgather_base": "all_gather_into_tensor"}
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
# The methods of a backend object (``group._get_backend(device)``, or a ``ProcessGroupGloo`` an implementation
# builds on a store): below the process group, past its collective operators. Recorded as "Backend.<name>";
# a process group's own calls of them run in C++ and are not seen again.
BACKEND_METHODS = (
    "allreduce",
    "allreduce_coalesced",
    "reduce",
    "broadcast",
    "allgather",
    "allgather_coalesced",
    "_allgather_base",
    "gather",
    "scatter",
    "reduce_scatter",
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


def spec_call(kind: str, args: tuple, kwargs: dict) -> WireCall:
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


def _int_list(sizes):
    return None if sizes is None else [int(s) for s in sizes]


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


def operator_name(func) -> tuple[str | None, str]:
    schema = getattr(func, "_schema", None)
    name = schema.name if schema is not None else str(func)
    return getattr(func, "namespace", None), name.split("::")[-1]


def _flat(value):
    """A list of lists of tensors as one list (c10d's Tensor[][] arguments)."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (list, tuple)) for v in value):
        return [t for v in value for t in v]
    return value


def operator_call(func, args: tuple, kwargs: dict) -> tuple[WireCall, Any]:
    """(the call, the group it runs on) of one collective operator, from its schema's argument names."""
    namespace, op = operator_name(func)
    names = [argument.name for argument in func._schema.arguments]
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    group = bound["group_name"] if "group_name" in bound else UNNAMED
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
    if isinstance(process_group, dist.ProcessGroup):
        return process_group
    try:
        return dist.ProcessGroup.unbox(process_group)
    except Exception:
        return UNNAMED
