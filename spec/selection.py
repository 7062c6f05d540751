"""Selecting one profile's entries from the specification, and checking the profile names it uses
(the files of ``spec/profiles``; see :func:`shardspec.spec.loader.load_spec`)."""

from __future__ import annotations

from dataclasses import replace

from shardspec.spec.documents import DataModel, FieldSpec, Profile, Spec, holds_for
from shardspec.spec.errors import SpecFileError
from shardspec.spec.profiles import (
    DEFAULT_PROFILE,
    ProfileError,
    bundled_dir,
    profile_file,
    profile_order,
    read_profile,
)
from shardspec.spec.rules import RULES_BY_NAME, Rules


class UnknownProfileError(ValueError):
    """A profile name the specification does not define."""


def spec_rules(spec: Spec, profile: str) -> Rules:
    """The rules of ``profile``: the spec's own profile of that name, else a bundled or registered one."""
    for known in spec.profiles:
        if known.name == profile:
            return known.rules
    try:
        return profile_file(profile).rules
    except ProfileError as exc:
        raise UnknownProfileError(str(exc)) from None


def select_profile(spec: Spec, profile: str) -> Spec:
    """``spec`` with only what holds for ``profile``'s rules (the loader checks that no ID has two entries
    that both hold)."""
    rules = spec_rules(spec, profile)
    model = spec.data_model
    types = tuple(replace(t, fields=_select_fields(t.fields, rules)) for t in model.types)
    return replace(
        spec,
        profile=profile,
        data_model=replace(
            model,
            types=types,
            arguments=_select_fields(model.arguments, rules),
            outputs=_select_fields(model.outputs, rules),
        ),
        invariants=tuple(e for e in spec.invariants if holds_for(e, rules)),
        preconditions=tuple(e for e in spec.preconditions if holds_for(e, rules)),
        clarifications=tuple(e for e in spec.clarifications if holds_for(e, rules)),
    )


def _select_fields(fields: tuple[FieldSpec, ...], rules: Rules) -> tuple[FieldSpec, ...]:
    return tuple(replace(f, fields=_select_fields(f.fields, rules)) for f in fields if holds_for(f, rules))


def with_profile_names(spec: Spec) -> Spec:
    """``spec`` with each entry's and field's ``profiles``: the spec's profiles whose rules it holds for."""

    def named(entry):
        names = tuple(p.name for p in spec.profiles if holds_for(entry, p.rules)) if entry.requires else ()
        return replace(entry, profiles=names)

    def fields(entries):
        return tuple(replace(named(f), fields=fields(f.fields)) for f in entries)

    model = spec.data_model
    return replace(
        spec,
        data_model=replace(
            model,
            types=tuple(replace(t, fields=fields(t.fields)) for t in model.types),
            arguments=fields(model.arguments),
            outputs=fields(model.outputs),
        ),
        invariants=tuple(named(e) for e in spec.invariants),
        preconditions=tuple(named(e) for e in spec.preconditions),
        clarifications=tuple(named(e) for e in spec.clarifications),
    )


def spec_profiles(base) -> tuple[Profile, ...]:
    """The spec's profiles: the files of ``base``/profiles, in :func:`profile_order`."""
    folder = bundled_dir(base)
    try:
        names = profile_order(folder)
    except ProfileError as exc:
        raise SpecFileError(str(folder), "profiles", str(exc)) from None
    return tuple(spec_profile(name, base) for name in names)


def spec_profile(name: str, base) -> Profile:
    """A profile of the spec, its rules read from ``base``/profiles/<name>.yaml."""
    path = bundled_dir(base).joinpath(f"{name}.yaml")
    try:
        loaded = read_profile(path, name, parents=lambda parent: spec_profile(parent, base))
    except ProfileError as exc:
        raise SpecFileError(str(path), "file", str(exc).removeprefix(f"{path}: ")) from None
    return Profile(name, loaded.upstream, loaded.meaning, loaded.rules, name == DEFAULT_PROFILE, loaded.extends)


def _check_profile_names(spec: Spec, paths: dict[str, str]) -> None:
    """Every ``requires`` names known rules and values."""
    for document, entries in (
        ("invariants", spec.invariants),
        ("preconditions", spec.preconditions),
        ("clarifications", spec.clarifications),
    ):
        for position, entry in enumerate(entries):
            check_requires(entry.requires, paths[document], f"{document}[{position}].requires")
    for place, field in _all_fields(spec.data_model):
        check_requires(field.requires, paths["data_model"], f"{place}.requires")


def check_requires(requires, path: str, place: str) -> None:
    """:class:`SpecFileError` at ``place`` for a rule of ``requires`` that does not exist, or a value it lacks."""
    for rule, values in requires:
        known = RULES_BY_NAME.get(rule)
        if known is None:
            raise SpecFileError(
                path, place, f"field 'requires': unknown rule {rule} (rules: {', '.join(RULES_BY_NAME)})"
            )
        for value in values:
            if value not in known.values:
                raise SpecFileError(
                    path, place, f"field 'requires': rule {rule} has no value {value} ({', '.join(known.values)})"
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
