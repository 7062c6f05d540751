"""The group a recorded call ran on, and that group in words when it is not the step's TP group."""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

try:
    from torch._C._distributed_c10d import Backend
except ImportError:  # a torch built without distributed support
    Backend = None

UNNAMED = object()  # a call whose group the recorder cannot tell
_SIGNATURES: dict = {}


def group_argument(name: str, original, args: tuple, kwargs: dict):
    """The group a torch.distributed function, process-group method or backend method was called on (for a
    method, the object it was called on); None: the default one."""
    if name.startswith(("ProcessGroup.", "Backend.")):
        return args[0] if args else UNNAMED
    if name == "batch_isend_irecv":
        ops = (args[0] if args else kwargs.get("p2p_op_list")) or []
        return getattr(ops[0], "group", None) if ops else None
    if "group" in kwargs:
        return kwargs["group"]
    try:
        if original not in _SIGNATURES:
            _SIGNATURES[original] = inspect.signature(original)
        bound = _SIGNATURES[original].bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):  # a call torch itself will refuse; its group does not matter then
        return None
    return bound.get("group")


def placement(group, tp_group) -> tuple[str | None, str | None]:
    """(``label``, ``own``) of a call on ``group``: ``label`` None where the call counts as on the TP group
    (``tp_group``; also the default group where it is the TP group), else the group in words, by its world
    ranks: ``the default group (world ranks [0, 1, 2, 3])``, ``a group of world ranks [2, 3]``. ``own``: for a
    process group of exactly the TP group's ranks that is not the TP group's object (an engine builds its own,
    as vLLM does), that group in words, named alike on every rank; the call counts as on the TP group where
    the step keeps to that one group (INV-WIRE-SEQUENCE judges it).

    ``group`` is a ProcessGroup, a group name (as functional collectives pass it), None (the default group),
    or a backend object (``group._get_backend(device)``, or a ``ProcessGroupGloo`` built by hand): a backend of
    a group torch.distributed knows is that group; any other backend cannot be attributed."""
    if tp_group is None:
        return None, None  # no torch.distributed group to compare with (a Communicator of its own)
    if group is UNNAMED:
        return "a group the recorder cannot name", None
    if isinstance(group, str):
        try:
            group = c10d._resolve_process_group(group)
        except Exception:
            return f"group {group!r}, which this process does not know", None
    if _is_backend(group):
        owner = _owning_group(group, tp_group)
        if owner is None:
            return (
                f"a {type(group).__name__} that no process group of torch.distributed holds (one the "
                "implementation built itself; hand an engine's own communicator to the recorder instead, "
                "see the guide)",
                None,
            )
        group = owner
    default = c10d._get_default_group() if c10d.is_initialized() else None
    group = default if group is None else group
    if _same_group(group, tp_group):
        return None, None
    ranks = _world_ranks(group)
    if _same_group(group, default):
        return f"the default group (world ranks {ranks})", None
    if ranks is not None and ranks == _world_ranks(tp_group):
        name = _group_name(group)
        return None, f"a group of the TP group's world ranks {ranks} built by the implementation ({name!r})"
    if ranks is not None:
        return f"a group of world ranks {ranks}", None
    name = _group_name(group)
    return (f"group {name!r}" if name else "a process group torch.distributed does not know"), None


def _same_group(group, other) -> bool:
    if group is None or other is None:
        return group is other
    return group is other or (_group_name(group) is not None and _group_name(group) == _group_name(other))


def _is_backend(group) -> bool:
    return Backend is not None and isinstance(group, Backend)


def _owning_group(backend, tp_group):
    """The process group torch.distributed knows (the TP group first) whose backend ``backend`` is; None if
    none is. A backend held by the caller keeps its Python object, so identity tells."""
    known = [tp_group] + [group for group in list(getattr(c10d._world, "pg_map", {})) if group is not tp_group]
    for group in known:
        for device_type in getattr(group, "_device_types", ()) or ():
            try:
                if group._get_backend(torch.device(device_type)) is backend:
                    return group
            except Exception:
                continue
    return None


def _group_name(group) -> str | None:
    try:
        return str(group.group_name) or None
    except Exception:
        return None


def _world_ranks(group) -> list[int] | None:
    try:
        return [int(r) for r in dist.get_process_group_ranks(group)]
    except Exception:
        return None
