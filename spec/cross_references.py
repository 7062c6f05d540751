"""The references between the specification documents, checked once they are built (spec/loader.py):
unique IDs, ``enforced_by`` targets, the data model's field paths and shape symbols. Any problem raises
one :class:`SpecFileError` naming the file, the place in it and the field at fault."""

from __future__ import annotations

import re

from shardspec.spec.documents import DataModel, Spec
from shardspec.spec.errors import SpecFileError

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_references(spec: Spec, paths: dict[str, str]) -> None:
    _check_data_model(spec.data_model, paths["data_model"])
    for document, entries in (
        ("invariants", spec.invariants),
        ("preconditions", spec.preconditions),
        ("clarifications", spec.clarifications),
    ):
        _check_unique_ids(entries, document, paths[document])
    _check_invariant_fields(spec, paths["invariants"])
    _check_precondition_fields(spec, paths["preconditions"])
    _check_enforced_by(spec, paths["clarifications"])


def _check_unique_ids(entries, document: str, path: str) -> None:
    first: dict[str, int] = {}
    for position, entry in enumerate(entries):
        if entry.id in first:
            raise SpecFileError(
                path,
                f"{document}[{position}].id",
                f"field 'id': duplicate ID {entry.id} (first at {document}[{first[entry.id]}])",
            )
        first[entry.id] = position


def _check_invariant_fields(spec: Spec, path: str) -> None:
    model = spec.data_model
    for position, inv in enumerate(spec.invariants):
        for k, name in enumerate(inv.fields):
            place = f"invariants[{position}].fields[{k}]"
            target = model.resolve_output(name)
            if target is None:
                raise SpecFileError(path, place, f"field '{name}' is not an output in data_model.yaml")
            root_step = _output_step(model, name)
            if inv.step != "step" and root_step not in (inv.step, "step"):
                raise SpecFileError(
                    path,
                    place,
                    f"field '{name}' is an output of step '{root_step}', not of the invariant's step '{inv.step}'",
                )


def _output_step(model: DataModel, path: str) -> str:
    roots = [o for o in model.outputs if path == o.name or path.startswith(o.name + ".")]
    return max(roots, key=lambda o: len(o.name)).step


def _check_precondition_fields(spec: Spec, path: str) -> None:
    for position, pre in enumerate(spec.preconditions):
        for k, name in enumerate(pre.fields):
            if spec.data_model.resolve_argument(name) is None:
                raise SpecFileError(
                    path,
                    f"preconditions[{position}].fields[{k}]",
                    f"field '{name}' is not an argument in data_model.yaml",
                )


def _check_enforced_by(spec: Spec, path: str) -> None:
    known = {e.id for e in (*spec.invariants, *spec.preconditions)}
    for position, cl in enumerate(spec.clarifications):
        for k, ref in enumerate(cl.enforced_by):
            if ref not in known:
                raise SpecFileError(
                    path, f"clarifications[{position}].enforced_by[{k}]", f"field 'enforced_by': unknown ID {ref}"
                )


def _check_data_model(model: DataModel, path: str) -> None:
    symbols = {s.name for s in model.symbols}
    types = {t.name for t in model.types}
    for section, entries in (("types", model.types), ("arguments", model.arguments), ("outputs", model.outputs)):
        _check_unique_names(entries, section, path)
    for position, spec in enumerate(model.types):
        _check_field_list(spec.fields, f"types[{position}].fields", symbols, types, path)
    _check_field_list(model.arguments, "arguments", symbols, types, path)
    _check_field_list(model.outputs, "outputs", symbols, types, path)


def _check_unique_names(entries, section: str, path: str) -> None:
    seen = set()
    for position, entry in enumerate(entries):
        if entry.name in seen:
            raise SpecFileError(path, f"{section}[{position}].name", f"field 'name': '{entry.name}' is defined twice")
        seen.add(entry.name)


def _check_field_list(fields, place: str, symbols: set, types: set, path: str) -> None:
    for position, spec in enumerate(fields):
        here = f"{place}[{position}]"
        if spec.ref is not None and spec.ref not in types:
            raise SpecFileError(path, f"{here}.ref", f"field 'ref': unknown type {spec.ref}")
        for key in ("shape", "received_shape"):
            _check_symbols(getattr(spec, key), f"{here}.{key}", symbols, path)
        if spec.local is not None:
            _check_symbols(spec.local.shape, f"{here}.local.shape", symbols, path)
        _check_field_list(spec.fields, f"{here}.fields", symbols, types, path)


def _check_symbols(shape, place: str, symbols: set, path: str) -> None:
    for k, expr in enumerate(shape or ()):
        unknown = [n for n in _IDENTIFIER.findall(expr) if n not in symbols]
        if unknown:
            raise SpecFileError(
                path, f"{place}[{k}]", f"field '{place.rsplit('.', 1)[-1]}': unknown symbol {unknown[0]}"
            )
