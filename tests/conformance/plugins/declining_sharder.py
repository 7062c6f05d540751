"""Declines extension fields with PRE-EXTENSION-SUPPORTED, as the spec allows."""

from shardspec.reference import ReferenceSharder
from shardspec.spec.errors import PreconditionError


class DeclinesExtensions(ReferenceSharder):
    def gather_sampler_output(self, *args, extension_fields=None, **kwargs):
        if extension_fields:
            raise PreconditionError("PRE-EXTENSION-SUPPORTED", "extension_fields", "not supported here")
        return super().gather_sampler_output(*args, **kwargs)
