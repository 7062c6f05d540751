"""Which of the caller's guarantees a case breaks under a profile's rules.

A profile's guarantee rules (spec/rules.py: ``layouts``, ``dtypes``, ``preconditions``,
``extension_fields``) say what the profile's engine sends. A case that sends something else breaks a
guarantee: under that profile it is *outside the contract*, no verdict on an implementation. The suite
does not run it (the report lists it apart, with the guarantee), except in the opt-in robustness run,
whose findings are never conformance failures. :func:`broken_guarantee` is the one place that decides.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from shardspec.spec.case_edits import DTYPE_EDITS, EXTENSIONS_DECLARED_EMPTY
from shardspec.spec.layouts import CONTIGUOUS, OFFSET
from shardspec.spec.loader import _package_root, document_schema, load_spec, load_yaml_document
from shardspec.spec.rules import Rules

# Layouts a caller that builds its inputs contiguous still passes: a prefix of a persistent buffer, or a
# slice past its start, is contiguous memory (unit strides).
CONTIGUOUS_LAYOUTS = (CONTIGUOUS, OFFSET)


@dataclass(frozen=True)
class Breach:
    """A guarantee a case breaks: the rule, the rule's value it breaks, and what the case sends, in words."""

    rule: str
    value: str
    what: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.value}: {self.what}"


def broken_guarantee(case, rules: Rules) -> Breach | None:
    """The first of the caller's guarantees under ``rules`` that ``case`` (any of its steps) breaks, or None
    where the profile's engine may send every step of it."""
    for step in (case, *getattr(case, "then", ())):
        for check in (_precondition, _extension_fields, _layout, _dtype):
            found = check(step, rules)
            if found is not None:
                return found
    return None


def extensions_declared(case) -> bool:
    """Whether ``case`` declares extension fields to the gather, even none at all."""
    return bool(case.extensions) or EXTENSIONS_DECLARED_EMPTY in (case.edits or [])


def _precondition(case, rules: Rules) -> Breach | None:
    if not rules.trusts_caller or case.expect_error is None or case.expect_error in construction_ids():
        return None
    return Breach("preconditions", rules.preconditions, f"the inputs break {case.expect_error}")


def _extension_fields(case, rules: Rules) -> Breach | None:
    if rules.has_extension_fields or not extensions_declared(case):
        return None
    names = ", ".join(sorted(case.extensions)) or "an empty set"
    return Breach("extension_fields", rules.extension_fields, f"extension fields declared ({names})")


def sends_layout(rules: Rules, layout: str) -> bool:
    """Whether the profile's callers pass inputs in ``layout`` (spec/layouts.py)."""
    return not rules.contiguous_only or layout in CONTIGUOUS_LAYOUTS


def sends_dtype(rules: Rules, field: str, dtype: str) -> bool:
    """Whether the profile's callers pass batch field ``field`` in ``dtype`` (any dtype of a field that takes
    only one: PRE-DTYPES decides those)."""
    allowed = engine_dtypes().get(field)
    return not rules.engine_dtypes_only or allowed is None or dtype in allowed


def _layout(case, rules: Rules) -> Breach | None:
    views = sorted((name, layout) for name, layout in (case.layouts or {}).items() if not sends_layout(rules, layout))
    if not views:
        return None
    name, layout = views[0]
    return Breach("layouts", rules.layouts, f"{name} passed as a {layout} view")


def _dtype(case, rules: Rules) -> Breach | None:
    sent = dict(case.batch_dtypes or {})
    sent.update(DTYPE_EDITS[name] for name in case.edits or () if name in DTYPE_EDITS)
    for name, dtype in sorted(sent.items()):
        if not sends_dtype(rules, name, dtype):
            engine = " or ".join(engine_dtypes()[name])
            return Breach("dtypes", rules.dtypes, f"{name} in {dtype} (the engine passes {engine})")
    return None


@functools.cache
def construction_ids() -> frozenset[str]:
    """The preconditions of the sharder's construction: the construction rule's, not the caller's step."""
    return frozenset(p.id for p in load_spec().preconditions if p.step == "construct")


@functools.cache
def engine_dtypes() -> dict[str, tuple[str, ...]]:
    """Batch field -> the dtypes the engine builds it in (its data-model dtype, and its engine_dtype where the
    engine's differs), for every batch field the data model lets take several dtypes."""
    model = load_yaml_document(_package_root().joinpath("data_model.yaml"), document_schema("data_model"))
    out: dict[str, tuple[str, ...]] = {}
    for record in model["types"]:
        if record["name"] != "InputBatch":
            continue
        for entry in record["fields"]:
            if len(entry.get("dtypes", ())) > 1:
                engine = (entry["dtype"], *([entry["engine_dtype"]] if "engine_dtype" in entry else []))
                out[entry["name"]] = tuple(dict.fromkeys(out.get(entry["name"], ()) + engine))
    return out
