"""The rules of the bundled profiles, by name: the corpus names the profiles its cases and entries run under,
and resolves those names here, once, when it is imported."""

from __future__ import annotations

from shardspec.spec.profiles import PROFILES, rules_of

BUNDLED_RULES = {name: rules_of(name) for name in PROFILES}
