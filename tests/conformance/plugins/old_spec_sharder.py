"""The reference, declaring that it targets an older spec version."""

from shardspec.reference import ReferenceSharder


class TargetsSpec01(ReferenceSharder):
    SPEC_VERSION = "0.1.0"
