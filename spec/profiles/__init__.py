"""Profiles: one upstream contract each, as data (``spec/profiles/<name>.yaml``).

A profile file names the profile it ``extends`` and the rules (``shardspec.spec.rules``) it sets or
changes; the root profile sets every rule. The bundled ones are the files of this folder
(:data:`PROFILES`, :func:`profile_order`): bundling one is adding its file. A user's own file
(``--profile-file engine.yaml``) extends a bundled one and is read once, as untrusted input
(:mod:`shardspec.spec.profile_input`), by :func:`load_profile_file` at the edge (the command line, the
pytest plugin), which registers it for the rest of the process.
Nothing reads it again: the processes a run starts receive the resolved rules as data with their
jobs (a case carries its :class:`Rules`), never through the environment or a name.

The edges (the command line, a case made under a profile, ``fixtures.catalogue.with_profile``) ask
:func:`rules_of` for a profile's rules once; below them code takes those :class:`Rules` (a
:class:`~shardspec.spec.case.Case` carries them) and branches on them, never on a name. No torch here:
the command line reads profiles before a run starts.
"""

from __future__ import annotations

import functools
import os
from contextvars import ContextVar
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from shardspec.spec.profile_input import (
    MAX_EXTENDS,
    NAME,
    ProfileError,
    content_hash,
    parse_profile,
    read_bounded,
)
from shardspec.spec.rules import GUARANTEE_RULES, RULES, Rules, contradiction, rule_problem

__all__ = ["ProfileError"]  # raised here, defined with the reading of a file (profile_input)

DEFAULT_PROFILE = "vllm-0.34"
# The variable the options table reads a user's profile file from (at the edge, like --profile-file).
PROFILE_FILE_ENV = "SHARDSPEC_PROFILE_FILE"


class UnknownProfile(ProfileError):
    """A profile name that is neither bundled nor registered."""


@dataclass(frozen=True)
class ProfileFile:
    """One profile as loaded: its name, parent, descriptions and every rule's value."""

    name: str
    extends: str | None
    upstream: str
    meaning: str
    rules: Rules
    # The rules this file sets itself (the rest are its parent's).
    own: tuple[str, ...] = ()
    # The file it was read from (a user's profile; None for a bundled one), and the sha256 of its bytes.
    path: str | None = None
    sha256: str | None = None
    # Profiles above it in its extends chain (bounded by MAX_EXTENDS).
    depth: int = 0


_REGISTERED: dict[str, ProfileFile] = {}


def bundled_dir(root: Path | None = None):
    return resources.files("shardspec.spec").joinpath("profiles") if root is None else Path(root) / "profiles"


def profile_order(folder) -> tuple[str, ...]:
    """The profiles of the files in ``folder`` (``<name>.yaml``): the default first, then the nearest to it in
    the extends tree: its descendants, then its parent with the parent's other descendants, and so on up
    (siblings by name); profiles of another tree last."""
    parents = {}
    for path in sorted(folder.iterdir(), key=lambda path: path.name):
        if path.name.endswith(".yaml"):
            parents[path.name.removesuffix(".yaml")] = parse_profile(read_bounded(path), path).get("extends")
    if DEFAULT_PROFILE not in parents:
        raise ProfileError(f"{folder}: no file of the default profile, {DEFAULT_PROFILE}.yaml")
    order: list[str] = []

    def add_tree(name: str) -> None:
        if name not in order:
            order.append(name)
            for child in (n for n, parent in parents.items() if parent == name):
                add_tree(child)

    name = DEFAULT_PROFILE
    while name in parents:
        add_tree(name)
        name = parents[name]
    for name in parents:
        add_tree(name)
    return tuple(order)


PROFILES = profile_order(bundled_dir())


@functools.cache
def bundled_profile(name: str) -> ProfileFile:
    """A bundled profile by name; :class:`ProfileError` for a name that is not one."""
    if name not in PROFILES:
        raise ProfileError(f"unknown profile {name!r} (bundled: {', '.join(PROFILES)})")
    return read_profile(bundled_dir().joinpath(f"{name}.yaml"), name)


def load_profile_file(path: str | os.PathLike) -> ProfileFile:
    """Read a user's profile file, register it under its name and return it (:class:`ProfileError`)."""
    path = Path(path).absolute()
    loaded = read_profile(path, None)
    if loaded.name in PROFILES:
        raise ProfileError(f"{path}: name {loaded.name!r} is a bundled profile's; give the file a name of its own")
    loaded = replace(loaded, path=str(path))
    _REGISTERED[loaded.name] = loaded
    return loaded


# The files whose extends chain is being resolved, innermost last: a chain that comes back to one is a cycle.
_RESOLVING: ContextVar[tuple[str, ...]] = ContextVar("resolving", default=())


def read_profile(path, name: str | None, parents=None) -> ProfileFile:
    """The profile of the file at ``path`` (``name``: its name, else the file's ``name`` or stem);
    ``parents``: how a parent's name is resolved (default :func:`profile_file`)."""
    chain = _RESOLVING.get()
    if str(path) in chain or len(chain) >= MAX_EXTENDS:
        raise ProfileError(
            f"{chain[0]}: extends chain {' -> '.join(map(_stem, (*chain, path)))} "
            + ("comes back to a profile in it" if str(path) in chain else f"is longer than {MAX_EXTENDS} profiles")
        )
    token = _RESOLVING.set((*chain, str(path)))
    try:
        return _read_profile(path, name, parents or profile_file)
    finally:
        _RESOLVING.reset(token)


def _stem(path) -> str:
    return Path(str(path)).stem


def _read_profile(path, name: str | None, parents) -> ProfileFile:
    raw = read_bounded(path)
    data = parse_profile(raw, path)
    name = name or data.get("name") or _stem(path)
    if not NAME.fullmatch(name):
        raise ProfileError(f"{path}: {name!r} is not a profile name ({NAME.pattern}); set the file's name")
    values = data.get("rules") or {}
    for rule, value in values.items():
        problem = rule_problem(rule, value)
        if problem:
            raise ProfileError(f"{path}: {problem}")
    parent = _parent(path, data.get("extends"), parents)
    merged = {**(parent.rules.as_dict() if parent else {}), **values}
    missing = [rule.name for rule in RULES if rule.name not in merged]
    if missing:
        raise ProfileError(f"{path}: rule {missing[0]} is not set and the profile extends none")
    problem = contradiction(merged)
    if problem:
        raise ProfileError(f"{path}: contradicts itself: {problem}")
    return ProfileFile(
        name=name,
        extends=parent.name if parent else None,
        upstream=data.get("upstream") or (parent.upstream if parent else ""),
        meaning=data.get("meaning") or "",
        rules=Rules.of(name, merged),
        own=tuple(values),
        sha256=content_hash(raw),
        depth=getattr(parent, "depth", 0) + 1 if parent else 0,
    )


def _parent(path, extends: str | None, parents) -> ProfileFile | None:
    if extends is None:
        return None
    try:
        parent = parents(extends)
    except UnknownProfile:
        raise ProfileError(f"{path}: extends unknown profile {extends!r} (bundled: {', '.join(PROFILES)})") from None
    # A registered file's depth; a spec's own Profile (selection.spec_profile) is bounded by _RESOLVING.
    if getattr(parent, "depth", 0) + 1 >= MAX_EXTENDS:
        raise ProfileError(f"{path}: extends {extends!r}, at the end of a chain of {MAX_EXTENDS} profiles already")
    return parent


def profile_file(name: str) -> ProfileFile:
    """A profile by name: registered (a user's file, or one handed to this process with its jobs) or
    bundled; :class:`UnknownProfile` otherwise. Never read from the environment: see the module's doc."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in PROFILES:
        return bundled_profile(name)
    raise UnknownProfile(f"unknown profile {name!r} (bundled: {', '.join(PROFILES)})")


def profile_source(name: str) -> dict[str, str] | None:
    """The file a user's profile was read from and the sha256 of the bytes read (None: a bundled one),
    for reports: the run was judged under those bytes, whatever the file holds now."""
    found = profile_file(name)
    return {"path": found.path, "sha256": found.sha256} if found.path else None


def default_rules() -> Rules:
    """The default profile's rules: what a case or a sharder given no rules follows."""
    return bundled_profile(DEFAULT_PROFILE).rules


def rules_of(profile: str | Rules) -> Rules:
    """The rules of a profile given by name (or already as rules)."""
    return profile if isinstance(profile, Rules) else profile_file(profile).rules


def root_profile(name: str) -> str:
    """The profile at the root of ``name``'s ``extends`` chain (the one that sets every rule itself)."""
    found = profile_file(name)
    while found.extends is not None:
        found = profile_file(found.extends)
    return found.name


def behaviour_profiles() -> tuple[str, ...]:
    """The bundled profiles that set some rule of the sharder's behaviour: one that changes only the caller's
    guarantees (spec/guarantees.py) behaves as the profile it extends."""
    return tuple(name for name in PROFILES if not set(bundled_profile(name).own) <= set(GUARANTEE_RULES))


def profile_names() -> tuple[str, ...]:
    """The bundled profiles (the default first) and those registered in this process."""
    return tuple(dict.fromkeys((*PROFILES, *_REGISTERED)))


def is_profile(name: str) -> bool:
    try:
        profile_file(name)
    except ProfileError:
        return False
    return True
