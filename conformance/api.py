"""How the suite finds the implementation under test.

An implementation is a *factory*::

    make_sharder(max_num_reqs, max_num_logits_per_req, *, comm, device) -> sharder

returning an object with the three methods of
:class:`shardspec.reference.ReferenceSharder` (same signatures):
``shard_sampler_inputs``, ``all_to_all_logits`` and ``gather_sampler_output``.
A class whose constructor has that signature is a factory.

``comm`` is a :class:`shardspec.comm.Communicator`. In a multi-process run it
is a :class:`shardspec.comm.TorchDistComm`; its ``.group`` attribute is the
``torch.distributed`` ProcessGroup of the run, so an implementation that calls
``torch.distributed`` itself passes ``group=comm.group`` to every collective.
In the in-process mode every rank is a thread and ``comm`` is a lockstep
communicator without ``.group``: such implementations must use the
multi-process mode (the default).

An implementation is named by a string: ``reference``, ``production`` or
``package.module:attr`` (``attr`` may be dotted).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable

IMPL_ENV = "SHARDSPEC_IMPL"
BUILTIN = {
    "reference": "shardspec.reference:ReferenceSharder",
    "production": "shardspec.impl:ProductionSharder",
}

SharderFactory = Callable[..., Any]


class ImplementationError(RuntimeError):
    """The named implementation cannot be loaded."""


@dataclass(frozen=True)
class Implementation:
    name: str  # as the user wrote it
    target: str  # "package.module:attr"
    factory: SharderFactory

    def make(self, max_num_reqs: int, max_num_logits_per_req: int, *, comm, device):
        return self.factory(max_num_reqs, max_num_logits_per_req, comm=comm, device=device)


def target_of(name: str) -> str:
    name = name.strip()
    if name in BUILTIN:
        return BUILTIN[name]
    if ":" not in name:
        raise ImplementationError(
            f"unknown implementation {name!r}: use 'reference', 'production' or 'package.module:attr'"
        )
    return name


def load_implementation(name: str) -> Implementation:
    target = target_of(name)
    module_name, attr_path = target.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = ""
        if name.strip() == "production":
            hint = " (the production implementation shardspec.impl.ProductionSharder is not importable)"
        elif not module_name.startswith("shardspec."):
            hint = " (is its folder on PYTHONPATH?)"
        raise ImplementationError(f"cannot import {module_name!r} for --impl {name!r}{hint}: {exc}") from exc
    factory: Any = module
    for part in attr_path.split("."):
        if not hasattr(factory, part):
            raise ImplementationError(f"{module_name!r} has no attribute {attr_path!r} (--impl {name!r})")
        factory = getattr(factory, part)
    if not callable(factory):
        raise ImplementationError(f"{target} is not callable (--impl {name!r})")
    return Implementation(name=name.strip(), target=target, factory=factory)


def implementation_names(cli_value: str | None) -> list[str]:
    """``--impl`` (comma-separated) or ``$SHARDSPEC_IMPL``; ``reference`` when neither is set."""
    raw = cli_value or os.environ.get(IMPL_ENV) or "reference"
    names = [part.strip() for part in raw.split(",") if part.strip()]
    for name in names:
        target_of(name)  # fail early on a malformed name
    return names


@dataclass(frozen=True)
class ImplChoice:
    """What each rank runs: ``impl`` on even ranks, ``impl_odd`` (if set) on odd ranks."""

    impl: str
    impl_odd: str | None = None

    def for_rank(self, rank: int) -> str:
        return self.impl_odd if self.impl_odd and rank % 2 == 1 else self.impl

    @property
    def label(self) -> str:
        return self.impl if not self.impl_odd else f"{self.impl} (even ranks) + {self.impl_odd} (odd ranks)"

    def cli_args(self) -> list[str]:
        args = ["--impl", self.impl]
        if self.impl_odd:
            args += ["--impl-odd", self.impl_odd]
        return args
