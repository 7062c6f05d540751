"""Selecting one profile's entries from the specification, and checking the profile names it uses
(``spec/index.yaml``'s ``profiles``; see :func:`shardspec.spec.loader.load_spec`)."""

from __future__ import annotations

from dataclasses import replace

from shardspec.spec.documents import DataModel, FieldSpec, Spec, holds_for
from shardspec.spec.errors import SpecFileError


class UnknownProfileError(ValueError):
    """A profile name the specification does not define."""


def select_profile(spec: Spec, profile: str) -> Spec:
    """``spec`` with only what holds for ``profile``."""
    model = spec.data_model
    types = tuple(replace(t, fields=_select_fields(t.fields, profile)) for t in model.types)
    return replace(
        spec,
        profile=profile,
        data_model=replace(
            model,
            types=types,
            arguments=_select_fields(model.arguments, profile),
            outputs=_select_fields(model.outputs, profile),
        ),
        invariants=tuple(e for e in spec.invariants if holds_for(e, profile)),
        preconditions=tuple(e for e in spec.preconditions if holds_for(e, profile)),
        clarifications=tuple(e for e in spec.clarifications if holds_for(e, profile)),
    )


def _select_fields(fields: tuple[FieldSpec, ...], profile: str) -> tuple[FieldSpec, ...]:
    return tuple(replace(f, fields=_select_fields(f.fields, profile)) for f in fields if holds_for(f, profile))


def _check_profile_names(spec: Spec, paths: dict[str, str]) -> None:
    known = {p.name for p in spec.profiles}
    if sum(p.default for p in spec.profiles) != 1:
        raise SpecFileError(paths["index"], "profiles", "field 'profiles': exactly one profile must be the default")
    for document, entries in (
        ("invariants", spec.invariants),
        ("preconditions", spec.preconditions),
        ("clarifications", spec.clarifications),
    ):
        for position, entry in enumerate(entries):
            _check_named_profiles(entry.profiles, known, paths[document], f"{document}[{position}].profiles")
    for place, field in _all_fields(spec.data_model):
        _check_named_profiles(field.profiles, known, paths["data_model"], f"{place}.profiles")


def _check_named_profiles(named, known: set, path: str, place: str) -> None:
    for name in named:
        if name not in known:
            raise SpecFileError(
                path, place, f"field 'profiles': unknown profile {name} (index.yaml defines {', '.join(sorted(known))})"
            )


def _all_fields(model: DataModel):
    def walk(fields, place):
        for position, field in enumerate(fields):
            here = f"{place}[{position}]"
            yield here, field
            yield from walk(field.fields, f"{here}.fields")

    for position, spec in enumerate(model.types):
        yield from walk(spec.fields, f"types[{position}].fields")
    yield from walk(model.arguments, "arguments")
    yield from walk(model.outputs, "outputs")
