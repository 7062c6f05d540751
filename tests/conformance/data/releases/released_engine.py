"""A factory that says which release it is (``RELEASE``), as examples/vllm's does: the page of releases
heads its column with it. Its defect is broken.rejection's AnonymousErrors (errors that name no ID)."""

from shardspec.conformance.broken.rejection import AnonymousErrors


class EngineNineNine(AnonymousErrors):
    """INV-REJECT-NAMES-PRECONDITION: invalid inputs raise ValueError without the precondition ID."""

    RELEASE = "engine 9.9"
