"""Profiles: one upstream contract each, as data (``spec/profiles/<name>.yaml``).

A profile file names the profile it ``extends`` and the rules (``shardspec.spec.rules``) it sets or
changes; the root profile sets every rule. The bundled ones are listed here and in spec/index.yaml (a
test keeps the two in step); a user's own file (``--profile-file engine.yaml``) extends a bundled one
and is registered by :func:`load_profile_file` for the rest of the process, and for the processes it
starts, through :data:`PROFILE_FILE_ENV`.

Code asks :func:`rules_of` for a profile's rules and branches on those, never on a name. No torch here:
the command line reads profiles before a run starts.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import yaml

from shardspec.spec.rules import GUARANTEE_RULES, RULES, Rules, rule_problem

PROFILES = ("vllm-0.34", "vllm-0.34-sharded-draft-cache", "vllm-0.34-strict", "vllm-0.33", "vllm-seed")
DEFAULT_PROFILE = "vllm-0.34"
# A user's profile file, read by every process that meets its name (the suite sets it for its ranks).
PROFILE_FILE_ENV = "SHARDSPEC_PROFILE_FILE"
_KEYS = ("name", "extends", "upstream", "meaning", "rules")


class ProfileError(ValueError):
    """A profile file or name that cannot be used; the message is one line naming the file and what."""


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
    # The file it was read from (a user's profile; None for a bundled one).
    path: str | None = None


_REGISTERED: dict[str, ProfileFile] = {}


def bundled_dir(root: Path | None = None):
    return resources.files("shardspec.spec").joinpath("profiles") if root is None else Path(root) / "profiles"


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
    # Registered last even when registered before: profile_environ hands on the file registered last.
    _REGISTERED.pop(loaded.name, None)
    _REGISTERED[loaded.name] = loaded
    return loaded


def profile_environ() -> dict[str, str]:
    """What a process this one starts needs in its environment to know the profile file registered last."""
    files = [p.path for p in _REGISTERED.values() if p.path]
    return {PROFILE_FILE_ENV: files[-1]} if files else {}


def read_profile(path, name: str | None, parents=None) -> ProfileFile:
    """The profile of the file at ``path`` (``name``: its name, else the file's ``name`` or stem);
    ``parents``: how a parent's name is resolved (default :func:`profile_file`)."""
    data = _read_mapping(path)
    extra = [k for k in data if k not in _KEYS]
    if extra:
        raise ProfileError(f"{path}: unknown key {extra[0]!r} (keys: {', '.join(_KEYS)})")
    name = name or str(data.get("name") or Path(str(path)).stem)
    values = data.get("rules") or {}
    if not isinstance(values, dict):
        raise ProfileError(f"{path}: rules: expected a mapping of rule names to values")
    for rule, value in values.items():
        problem = rule_problem(str(rule), value)
        if problem:
            raise ProfileError(f"{path}: {problem}")
    parent = _parent(path, data.get("extends"), parents or profile_file)
    merged = {**(parent.rules.as_dict() if parent else {}), **values}
    missing = [rule.name for rule in RULES if rule.name not in merged]
    if missing:
        raise ProfileError(f"{path}: rule {missing[0]} is not set and the profile extends none")
    return ProfileFile(
        name=name,
        extends=parent.name if parent else None,
        upstream=str(data.get("upstream") or (parent.upstream if parent else "")),
        meaning=str(data.get("meaning") or ""),
        rules=Rules.of(name, merged),
        own=tuple(values),
    )


def _read_mapping(path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot be read: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: invalid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping (extends, rules, ...)")
    return data


def _parent(path, extends, parents) -> ProfileFile | None:
    if extends is None:
        return None
    try:
        return parents(str(extends))
    except ProfileError:
        raise ProfileError(f"{path}: extends unknown profile {extends!r} (bundled: {', '.join(PROFILES)})") from None


def profile_file(name: str) -> ProfileFile:
    """A profile by name: bundled, registered, or the one of :data:`PROFILE_FILE_ENV`."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in PROFILES:
        return bundled_profile(name)
    from_env = os.environ.get(PROFILE_FILE_ENV)
    if from_env and read_profile(Path(from_env), None).name == name:
        return load_profile_file(from_env)
    raise ProfileError(f"unknown profile {name!r} (bundled: {', '.join(PROFILES)})")


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
    return (*PROFILES, *_REGISTERED)


def is_profile(name: str) -> bool:
    try:
        profile_file(name)
    except ProfileError:
        return False
    return True
