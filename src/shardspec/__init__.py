"""shardspec: the contract of batch-sharded sampling under tensor parallelism.

Sub-packages (the repository folders they come from):

- ``shardspec.spec`` (``spec/``): the contract as YAML, its schema, loader,
  renderer, and the Python data model.
- ``shardspec.reference`` (``reference/``): pure-torch reference implementation.
- ``shardspec.impl`` (``impl/``): production implementation (Triton kernels).
- ``shardspec.conformance`` (``conformance/``): the conformance suite.
- ``shardspec.fixtures`` (``fixtures/``): golden cases.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("shardspec")  # pyproject.toml's, as installed
except _metadata.PackageNotFoundError:  # a source tree that is not installed
    __version__ = "0+unknown"
