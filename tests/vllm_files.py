"""vLLM's published batch_shard.py of a supported release, for the tests that run or read it.

Looked for, in this order:

1. the release's wheel, ``vllm-<release>-*.whl``, in $SHARDSPEC_VLLM_WHEELS or else in ``.nox/wheels``
   of this checkout, where ``nox -s drift`` downloads each supported release's wheel (--no-deps): the
   file is read out of the wheel (a zip; nothing is installed) into a temporary folder;
2. a copy of vLLM's files beside the checkout, ``../shared/upstream/vllm-<release>/``.

Where neither has it, the tests that need it skip and say where it was looked for. With
SHARDSPEC_REQUIRE_VLLM_FILES=1 (set by .ci/run, after ``nox -s drift``) a missing file fails the
collection instead: a run that is meant to exercise vLLM's file cannot go green by skipping it.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import pytest

from shardspec.conformance.upstream.source import SHARD_FILE

ROOT = Path(__file__).resolve().parents[1]
REQUIRE = "SHARDSPEC_REQUIRE_VLLM_FILES"


def wheels_folder() -> Path:
    return Path(os.environ.get("SHARDSPEC_VLLM_WHEELS") or ROOT / ".nox" / "wheels")


def shared_file(release: str) -> Path:
    return ROOT.parent / "shared" / "upstream" / f"vllm-{release}" / SHARD_FILE


@functools.cache
def batch_shard_file(release: str) -> Path | None:
    """vLLM ``release``'s batch_shard.py (read out of its wheel where there is one), or None."""
    wheels = sorted(wheels_folder().glob(f"vllm-{release}-*.whl"))
    if wheels:
        return _read_out(wheels[0], release)
    shared = shared_file(release)
    return shared if shared.is_file() else None


def _read_out(wheel: Path, release: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix=f"shardspec-vllm-{release}-"))
    atexit.register(shutil.rmtree, folder, True)
    target = folder / SHARD_FILE
    target.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as archive:
        target.write_bytes(archive.read(SHARD_FILE))
    return target


def missing(release: str) -> str:
    return (
        f"vLLM {release}'s batch_shard.py: no vllm-{release}-*.whl in {wheels_folder()} (nox -s drift downloads "
        f"it there; or set SHARDSPEC_VLLM_WHEELS) and no {shared_file(release)}"
    )


def needs(release: str) -> pytest.MarkDecorator:
    """Skips the test where vLLM ``release``'s file cannot be had; where REQUIRE is set, fails the collection."""
    found = batch_shard_file(release)
    if found is None and os.environ.get(REQUIRE):
        raise RuntimeError(f"{missing(release)}, and {REQUIRE} is set")
    return pytest.mark.skipif(found is None, reason=missing(release))
