"""The group a recorded call ran on, and that group in words when it is not the step's TP group."""

from __future__ import annotations

import inspect

UNNAMED = object()  # a call whose group the recorder cannot tell
_SIGNATURES: dict = {}


def group_argument(name: str, original, args: tuple, kwargs: dict):
    """The group a torch.distributed function or process-group method was called on; None: the default one."""
    if name.startswith("ProcessGroup."):
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


def group_label(group, tp_group) -> str | None:
    """None for the TP group (``tp_group``; also the default group where it is the TP group); otherwise the
    group in words, by its world ranks: ``the default group (world ranks [0, 1, 2, 3])``, ``a group of world
    ranks [2, 3]``. ``group`` is a ProcessGroup, a group name (as functional collectives pass it) or None
    (the default group)."""
    if tp_group is None:
        return None  # no torch.distributed group to compare with (a Communicator of its own)
    import torch.distributed.distributed_c10d as c10d

    if group is UNNAMED:
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
