"""How the suite finds the implementation under test.

An implementation is a *factory*::

    make_sharder(max_num_reqs, max_num_logits_per_req, *, comm, device) -> sharder

Under a profile with adaptive verification (vllm-0.33) the suite also passes
``adaptive_verification_enabled`` (vLLM 0.33's construction argument), and ``profile`` (the run's
profile name) to a factory that takes it, as the bundled ones do, since they follow the rules of any
profile. A factory that declares ``SPEC_PROFILES`` (a tuple of names) is refused, before anything runs,
for a profile it does not list; one that declares ``SPEC_RULES`` (rule name -> the values it
implements, spec/rules.py), for a profile whose rules take another value.

A factory may also say what it is with ``RELEASE`` (a string, e.g. ``"vLLM 0.34.0"``): the JSON
report records it, and the page of releases (``report releases``) heads its column with it.

returning an object with the three methods of
:class:`shardspec.reference.ReferenceSharder` (same signatures):
``shard_sampler_inputs``, ``all_to_all_logits`` and ``gather_sampler_output``.
A class whose constructor has that signature is a factory.

``comm`` is a :class:`shardspec.comm.Communicator`. In a multi-process run it
is a :class:`shardspec.comm.TorchDistComm`; its ``.group`` attribute is the
``torch.distributed`` ProcessGroup of the run, so an implementation that calls
``torch.distributed`` itself passes ``group=comm.group`` to every collective.
In the in-process mode every rank is a thread; with the default lockstep
group ``comm`` has no ``.group``, so such implementations use the
multi-process mode (the default) or the in-process torch-threads group, where
``comm`` is a TorchDistComm of torch's threaded backend.

An implementation is named by a string: ``reference``, ``production`` or
``package.module:attr`` (``attr`` may be dotted). An *entry* of a run is one
name, or ``A/B``: a mixed group where even ranks run ``A`` and odd ranks run
``B`` (they must interoperate through the wire layout of the spec).
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardspec.spec.rules import Rules

IMPL_ENV = "SHARDSPEC_IMPL"  # --impl's variable (the options' table, run/options.py, names it from here)
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


def construction_kwargs(factory: SharderFactory, rules: Rules, adaptive_verification: bool) -> dict[str, Any]:
    """The keyword arguments a profile adds to the factory's call, those it accepts: its name as
    ``profile`` to a factory that names that keyword and not ``rules``, else its rules as ``rules`` (the
    bundled sharders' keyword; a factory that takes keywords it does not name may forward them to one)."""
    by_name = _names(factory, "profile") and not _names(factory, "rules")
    wanted: dict[str, Any] = {"profile": rules.profile} if by_name else {"rules": rules}
    if rules.adaptive:
        wanted["adaptive_verification_enabled"] = adaptive_verification
    return {name: value for name, value in wanted.items() if _accepts(factory, name)}


def _names(factory: SharderFactory, name: str) -> bool:
    try:
        return name in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def _accepts(factory: SharderFactory, name: str) -> bool:
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    if name in parameters:
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def profile_refusal(impl: Implementation, rules: Rules) -> str | None:
    """Why ``impl`` cannot run under the profile of ``rules`` (it declares SPEC_PROFILES without it, or
    SPEC_RULES without the value one of the profile's rules has), or None."""
    profile = rules.profile
    declared = getattr(impl.factory, "SPEC_PROFILES", None)
    if declared is not None and profile not in tuple(declared):
        return f"--impl {impl.name!r} implements profiles {', '.join(declared)}, not {profile} (--profile)"
    for rule, values in (getattr(impl.factory, "SPEC_RULES", None) or {}).items():
        if getattr(rules, rule) not in tuple(values):
            return (
                f"--impl {impl.name!r} implements rule {rule}: {', '.join(values)}, not profile {profile}'s "
                f"{getattr(rules, rule)} (--profile)"
            )
    return None


def implementation_names(cli_value: str | None, impl_odd: str | None = None) -> list[str]:
    """The run's entries: ``--impl`` (comma-separated) or ``$SHARDSPEC_IMPL``; ``reference`` when
    neither is set. ``impl_odd`` turns every single-name entry ``A`` into ``A/impl_odd``. (A run's
    options are resolved by :func:`shardspec.conformance.run.resolve.resolve`, which reads the variable
    itself and always passes ``cli_value``.)"""
    raw = cli_value or os.environ.get(IMPL_ENV) or "reference"
    names = [part.strip() for part in raw.split(",") if part.strip()]
    if impl_odd:
        names = [name if ImplChoice.parse(name).mixed else f"{name}/{impl_odd.strip()}" for name in names]
    for name in names:
        ImplChoice.parse(name)  # fail early on a malformed entry
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class ImplChoice:
    """What each rank runs: ``impl`` on even ranks, ``impl_odd`` (if set) on odd ranks."""

    impl: str
    impl_odd: str | None = None

    @classmethod
    def parse(cls, entry: str) -> ImplChoice:
        """``A`` or ``A/B`` (even ranks ``A``, odd ranks ``B``); the names are checked, not imported."""
        parts = [part.strip() for part in entry.split("/")]
        if len(parts) > 2 or not all(parts):
            raise ImplementationError(f"malformed implementation entry {entry!r}: use 'A' or 'A/B'")
        for name in parts:
            target_of(name)
        return cls(parts[0], parts[1] if len(parts) == 2 else None)

    @property
    def mixed(self) -> bool:
        return self.impl_odd is not None

    def for_rank(self, rank: int) -> str:
        return self.impl_odd if self.impl_odd and rank % 2 == 1 else self.impl

    def names(self) -> list[str]:
        return [self.impl] + ([self.impl_odd] if self.impl_odd else [])

    def applies_to(self, tp_size: int) -> bool:
        """A mixed group needs an odd rank: tp 1 has none."""
        return not self.mixed or tp_size > 1

    @property
    def label(self) -> str:
        return "/".join(self.names())

    def cli_args(self) -> list[str]:
        return ["--impl", self.label]
