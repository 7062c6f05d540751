"""What an entry of the broken corpus is: a sharder with one defect, the targeted cases that expose it, the
in-process groups and the profiles it runs under."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace

from shardspec.conformance.broken.profiles import BUNDLED_RULES
from shardspec.spec.guarantees import broken_guarantee
from shardspec.spec.profiles import DEFAULT_PROFILE, PROFILES, bundled_profile
from shardspec.spec.rules import GUARANTEE_RULES

PACKAGE = __name__.rpartition(".")[0]  # the corpus package
ALL_GROUPS = ("lockstep", "torch-threads")
TORCH_GROUPS = ("torch-threads",)


@dataclass(frozen=True)
class Entry:
    name: str  # readable id
    target: str  # "shardspec.conformance.broken.<module>:<class>", usable as --impl
    cases: tuple[str, ...]  # ids of cases in .cases that expose the defect
    # The in-process groups it runs in: defects that call torch.distributed need a group that has one.
    groups: tuple[str, ...] = ALL_GROUPS
    # The profiles its cases run under: a defect in one profile may be the rule of another (an int64
    # local idx_mapping is vllm-0.33's rule for an int64 batch, a defect in vllm-seed).
    profiles: tuple[str, ...] = (DEFAULT_PROFILE,)
    # TP groups of the world it runs in: a defect on the default group shows only in a world of several, which
    # only rank processes make (tests/meta/test_suite_rejects_broken.py runs those entries so).
    tp_groups: int = 1

    @property
    def factory(self):
        module, attr = self.target.split(":")
        return getattr(importlib.import_module(module), attr)

    @property
    def invariant_id(self) -> str:
        return self._doc()[0]

    @property
    def description(self) -> str:
        return self._doc()[1]

    def _doc(self) -> tuple[str, str]:
        invariant_id, _, description = (self.factory.__doc__ or "").strip().partition(": ")
        return invariant_id.split()[0] if invariant_id else "", description.strip()


def entry(
    name: str,
    module: str,
    cls: str,
    *cases: str,
    groups: tuple[str, ...] = ALL_GROUPS,
    requires: dict[str, str] | None = None,
    tp_groups: int = 1,
) -> Entry:
    """An entry run under the default profile, or (``requires``: rule values) under every bundled profile
    whose rules have those values (``{}``: every profile)."""
    return Entry(name, f"{PACKAGE}.{module}:{cls}", cases, groups, profiles_requiring(requires), tp_groups)


def profiles_requiring(requires: dict[str, str] | None) -> tuple[str, ...]:
    if requires is None:
        return (DEFAULT_PROFILE,)
    return tuple(
        name for name, rules in BUNDLED_RULES.items() if all(rules.as_dict()[k] == v for k, v in requires.items())
    )


def within_contract(entry: Entry, by_id: dict) -> Entry:
    """``entry`` under the profiles whose callers send each of its cases (``by_id``: case id -> case): a defect
    on a case outside a profile's contract is no defect there. Where none of its profiles sends them, under
    the bundled profiles that extend one of them with the caller's guarantees alone, where those admit the
    cases (vllm-0.34-strict: a sharder that accepts a must-reject case is caught there)."""

    def admits(profile: str) -> bool:
        return all(broken_guarantee(by_id[case_id], BUNDLED_RULES[profile]) is None for case_id in entry.cases)

    kept = tuple(p for p in entry.profiles if admits(p))
    if not kept:
        kept = tuple(
            p
            for p in PROFILES
            if bundled_profile(p).extends in entry.profiles
            and set(bundled_profile(p).own) <= set(GUARANTEE_RULES)
            and admits(p)
        )
    return replace(entry, profiles=kept)
