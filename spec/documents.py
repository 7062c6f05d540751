"""The specification documents as frozen Python objects (built by ``loader``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardspec.spec.rules import Rules

# What an entry requires of a profile's rules: (rule name, the values it holds for), sorted by rule.
Requires = tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True)
class Invariant:
    id: str
    level: str
    step: str
    statement: str
    rationale: str
    fields: tuple[str, ...]
    retired: bool = False
    # The rule values this entry holds for ((rule, allowed values), spec/rules.py); empty: every profile.
    requires: Requires = ()
    # Derived by the loader from ``requires``: the spec's profiles it holds for; empty: every profile.
    profiles: tuple[str, ...] = ()


@dataclass(frozen=True)
class OnViolation:
    """What an implementation does when a precondition does not hold."""

    outcome: str  # "reject" | "undefined"
    reason: str
    raised_on: str | None = None  # "every rank" | "the faulty rank" (reject only)


@dataclass(frozen=True)
class Precondition:
    id: str
    level: str
    step: str
    statement: str
    fields: tuple[str, ...]
    error: str
    on_violation: OnViolation
    rationale: str | None = None
    retired: bool = False
    requires: Requires = ()
    profiles: tuple[str, ...] = ()

    @property
    def must_reject(self) -> bool:
        return self.on_violation.outcome == "reject"


@dataclass(frozen=True)
class Clarification:
    id: str
    topic: str
    question: str
    decision: str
    rationale: str
    enforced_by: tuple[str, ...]
    requires: Requires = ()
    profiles: tuple[str, ...] = ()


@dataclass(frozen=True)
class LocalView:
    """How a field of the batch appears in the local batch."""

    scope: str  # "localized" | "global" | "unread" (any value: no consumer reads it)
    dtype: str | None = None  # "input": the batch field's own dtype
    shape: tuple[str, ...] | None = None
    note: str | None = None


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type: str
    placement: str
    meaning: str
    dtype: str | None = None
    shape: tuple[str, ...] | None = None
    received_shape: tuple[str, ...] | None = None
    optional: bool = False
    ref: str | None = None
    local: LocalView | None = None
    step: str | None = None
    view: str | None = None
    expand: bool = False
    layout: str | None = None
    fields: tuple[FieldSpec, ...] = ()
    requires: Requires = ()
    profiles: tuple[str, ...] = ()


@dataclass(frozen=True)
class TypeSpec:
    name: str
    meaning: str
    fields: tuple[FieldSpec, ...]
    python: str | None = None


@dataclass(frozen=True)
class Symbol:
    name: str
    meaning: str


@dataclass(frozen=True)
class DataModel:
    symbols: tuple[Symbol, ...]
    types: tuple[TypeSpec, ...]
    arguments: tuple[FieldSpec, ...]
    outputs: tuple[FieldSpec, ...]

    def type(self, name: str) -> TypeSpec:
        for spec in self.types:
            if spec.name == name:
                return spec
        raise KeyError(f"no type {name!r} in the data model")

    def resolve_output(self, path: str) -> FieldSpec | None:
        """The output (or sub-field of one) a dotted path names, or None."""
        return self._resolve(self.outputs, path)

    def resolve_argument(self, path: str) -> FieldSpec | None:
        return self._resolve(self.arguments, path)

    def output_leaves(self) -> list[tuple[str, FieldSpec]]:
        """Every output that must be constrained: expanded outputs by their fields."""
        leaves = []
        for output in self.outputs:
            leaves.extend(self._leaves(output.name, output) if output.expand else [(output.name, output)])
        return leaves

    def _leaves(self, path: str, node: FieldSpec) -> list[tuple[str, FieldSpec]]:
        leaves = []
        for child in self._children(node):
            child_path = f"{path}.{child.name}"
            leaves.extend(self._leaves(child_path, child) if child.ref else [(child_path, child)])
        return leaves

    def _children(self, node: FieldSpec) -> tuple[FieldSpec, ...]:
        return self.type(node.ref).fields if node.ref else node.fields

    def _resolve(self, roots: tuple[FieldSpec, ...], path: str) -> FieldSpec | None:
        # Root names may contain dots ("wire.all_to_all"): take the longest match.
        for root in sorted(roots, key=lambda r: -len(r.name)):
            if path == root.name:
                return root
            if path.startswith(root.name + "."):
                return self._walk(root, path[len(root.name) + 1 :].split("."))
        return None

    def _walk(self, node: FieldSpec, names: list[str]) -> FieldSpec | None:
        for name in names:
            node = next((c for c in self._children(node) if c.name == name), None)
            if node is None:
                return None
        return node


@dataclass(frozen=True)
class Document:
    name: str
    file: str
    title: str


@dataclass(frozen=True)
class Profile:
    """One upstream contract the spec describes: a file of spec/profiles, profiles/<name>.yaml, which holds
    its rules."""

    name: str
    upstream: str
    meaning: str
    rules: Rules
    default: bool = False
    extends: str | None = None


def holds_for(entry, rules: Rules | None) -> bool:
    """Whether a spec entry (or field) with ``requires`` holds under ``rules`` (None: any profile)."""
    return rules is None or rules.holds(entry.requires)


def requires_of(requires: dict) -> Requires:
    """A document's ``requires`` mapping (rule: a value, or a list of values) as :data:`Requires`."""
    return tuple(sorted((rule, tuple(v) if isinstance(v, list) else (v,)) for rule, v in requires.items()))


def requires_text(requires: Requires) -> str:
    """``rule: value`` (or ``rule: a | b``) for each rule an entry requires, joined by ``, ``."""
    return ", ".join(f"{rule}: {' | '.join(values)}" for rule, values in requires)


@dataclass(frozen=True)
class Spec:
    name: str
    title: str
    version: str
    documents: tuple[Document, ...]
    sections: tuple[tuple[str, str], ...]
    example: dict
    data_model: DataModel
    invariants: tuple[Invariant, ...] = ()
    preconditions: tuple[Precondition, ...] = ()
    clarifications: tuple[Clarification, ...] = ()
    profiles: tuple[Profile, ...] = ()
    # The profile the entries were selected for (load_spec(profile=...)); None: every entry of every profile.
    profile: str | None = None

    def by_id(self, entry_id: str) -> Invariant | Precondition | Clarification:
        for entry in (*self.invariants, *self.preconditions, *self.clarifications):
            if entry.id == entry_id:
                return entry
        raise KeyError(f"no spec entry with ID {entry_id!r}")

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(e.id for e in (*self.invariants, *self.preconditions, *self.clarifications))
