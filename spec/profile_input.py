"""A profile file read as untrusted input: a user's file is whatever a path names, so it is read with
bounds before anything of it is believed.

- Only a regular file is read: a FIFO, a directory or a device is refused from ``fstat`` of a
  descriptor opened without blocking, so nothing waits for a writer and nothing endless is read.
- At most :data:`MAX_PROFILE_BYTES` are read.
- The YAML is read by a safe loader that refuses anchors and aliases (a "billion laughs" file is
  refused at its first anchor, before anything is expanded), duplicate keys, and nesting deeper
  than :data:`MAX_YAML_DEPTH`.
- Every field has the type it is documented with; a rule's value is checked by the rules
  (:func:`shardspec.spec.rules.rule_problem`).

Every refusal is a :class:`ProfileError` of one line that names the file. No torch here.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat

import yaml

MAX_PROFILE_BYTES = 64 * 1024  # the bundled profiles are under 1 KiB each
MAX_YAML_DEPTH = 8  # a profile is a mapping of a mapping of strings
MAX_EXTENDS = 16  # profiles in one extends chain (the bundled chain has 4)
KEYS = ("name", "extends", "upstream", "meaning", "rules")
# A profile's name is printed in reports and reproduce lines and names golden folders: one safe word.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class ProfileError(ValueError):
    """A profile file or name that cannot be used; the message is one line naming the file and what."""


def read_bounded(path) -> bytes:
    """The bytes of the regular file at ``path``, at most :data:`MAX_PROFILE_BYTES` of them."""
    if not isinstance(path, (str, os.PathLike)):  # a bundled profile inside an archive (importlib.resources)
        return _capped(path, path.read_bytes())
    try:
        # O_NONBLOCK: opening a FIFO does not wait for a writer; fstat below refuses it unread.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ProfileError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ProfileError(f"{path}: not a regular file ({_kind(mode)}); a profile is a YAML file")
    with os.fdopen(fd, "rb") as stream:
        try:
            data = stream.read(MAX_PROFILE_BYTES + 1)
        except OSError as exc:
            raise ProfileError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    return _capped(path, data)


def _capped(path, data: bytes) -> bytes:
    if len(data) > MAX_PROFILE_BYTES:
        raise ProfileError(f"{path}: over {MAX_PROFILE_BYTES // 1024} KiB; a profile file is a few rules")
    return data


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device")):
        if test(mode):
            return kind
    return "a special file"


def content_hash(data: bytes) -> str:
    """The sha256 of a profile file's bytes, as the report names it."""
    return hashlib.sha256(data).hexdigest()


class _ProfileLoader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors, aliases, duplicate keys or deep nesting."""

    depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise yaml.composer.ComposerError(None, None, "anchors and aliases are not allowed", event.start_mark)
        if self.depth >= MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", event.start_mark
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is not a string", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_profile(data: bytes, path) -> dict:
    """The mapping a profile file holds, every field of its documented type (:class:`ProfileError`)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{path}: cannot be read: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        found = yaml.load(text, Loader=_ProfileLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ProfileError(f"{path}: invalid YAML{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: invalid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(found, dict):
        raise ProfileError(f"{path}: expected a mapping (extends, rules, ...)")
    extra = [k for k in found if k not in KEYS]
    if extra:
        raise ProfileError(f"{path}: unknown key {extra[0]!r} (keys: {', '.join(KEYS)})")
    for key in ("name", "extends", "upstream", "meaning"):
        if found.get(key) is not None and not isinstance(found[key], str):
            raise ProfileError(f"{path}: {key}: expected a string, not {type(found[key]).__name__}")
    for key in ("name", "extends"):
        if found.get(key) is not None and not NAME.fullmatch(found[key]):
            raise ProfileError(f"{path}: {key}: {found[key]!r} is not a profile name ({NAME.pattern})")
    rules = found.get("rules")
    if rules is not None and not isinstance(rules, dict):
        raise ProfileError(f"{path}: rules: expected a mapping of rule names to values")
    return found
