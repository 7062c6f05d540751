"""The upstream checks' input: vLLM's batch_shard.py read from a source tree, a wheel (from the zip), one file, or
``installed`` (found with importlib.util.find_spec), never imported; each file read bounded."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path

SHARD_FILE = "vllm/v1/worker/gpu/sample/batch_shard.py"


class UpstreamInputError(Exception):
    """Bad input: the one-line message is printed and the exit code is 2."""


@dataclass
class Source:
    label: str  # how the report names the file
    text: str
    version: str | None = None  # vLLM's version, where the tree or wheel states it


def read_source(arg: str) -> Source:
    if arg == "installed":
        return _installed()
    path = Path(arg)
    if not path.exists():
        raise UpstreamInputError(f"{arg}: no such file or directory")
    if path.is_dir():
        return _tree(path)
    if path.suffix in (".whl", ".py"):
        return _wheel(path) if path.suffix == ".whl" else Source(str(path), _read_text(path))
    raise UpstreamInputError(f"{arg}: not a vLLM source tree, a vLLM wheel (.whl) or a batch_shard.py")


# The most bytes a file of the check is read to (vLLM 0.33's batch_shard.py has about 40 KB, a wheel's METADATA
# a few KB): a larger one is refused, never read into memory.
MAX_MEMBER_BYTES = 4 << 20


def _regular(path: Path) -> os.stat_result:
    """``path``'s status if it is a regular file (a link to one is followed), else an UpstreamInputError: a
    FIFO or a device would be waited on, or read for ever."""
    try:
        found = path.stat()
    except OSError as exc:
        raise UpstreamInputError(f"{path}: cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(found.st_mode):
        kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
        kind = next((name for test, name in kinds if test(found.st_mode)), "not a regular file")
        raise UpstreamInputError(f"{path}: is {kind}, not a regular file")
    return found


def _read_text(path: Path) -> str:
    size = _regular(path).st_size
    if size > MAX_MEMBER_BYTES:
        raise UpstreamInputError(f"{path}: {size} bytes, more than {MAX_MEMBER_BYTES} (not a source file of vLLM)")
    try:
        with open(path, "rb") as stream:
            return stream.read(MAX_MEMBER_BYTES + 1)[:MAX_MEMBER_BYTES].decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UpstreamInputError(f"{path}: cannot be read: {exc}") from None


def _member(wheel: zipfile.ZipFile, name: str, path: Path) -> str:
    """A member of a wheel, its declared size bounded before a byte is unpacked (zipfile stops there)."""
    size = wheel.getinfo(name).file_size
    if size > MAX_MEMBER_BYTES:
        raise UpstreamInputError(f"{path}: {name} is {size} bytes unpacked, more than {MAX_MEMBER_BYTES}")
    with wheel.open(name) as stream:
        return stream.read(MAX_MEMBER_BYTES + 1)[:MAX_MEMBER_BYTES].decode("utf-8")


def _installed() -> Source:
    found = importlib.util.find_spec("vllm")  # a top-level name: located, not imported
    if found is None or not found.submodule_search_locations:
        raise UpstreamInputError("installed: no vllm package is installed (importlib finds none)")
    package = Path(list(found.submodule_search_locations)[0])
    try:
        return _tree(package.parent, importlib.metadata.version("vllm"))
    except importlib.metadata.PackageNotFoundError:
        return _tree(package.parent)


def _tree(root: Path, version: str | None = None) -> Source:
    root = root.parent if root.name == "vllm" and not (root / "vllm").is_dir() else root
    if not (root / "vllm").is_dir():
        raise UpstreamInputError(f"{root}: not a vLLM source tree (no vllm/ folder in it)")
    if not (root / SHARD_FILE).is_file():
        raise UpstreamInputError(f"{root}: no {SHARD_FILE} in it")
    version_file = root / "vllm" / "_version.py"  # setuptools-scm writes it, in a checkout and an install
    text = _read_text(version_file) if version_file.is_file() else ""
    stated = re.search(r"^__version__ *=[^'\"\n]*['\"]([^'\"]+)", text, re.M)  # __version__ = version = '0.33.0'
    return Source(str(root / SHARD_FILE), _read_text(root / SHARD_FILE), version or (stated and stated[1]))


def _wheel(path: Path) -> Source:
    _regular(path)
    try:
        with zipfile.ZipFile(path) as wheel:
            names = wheel.namelist()
            metadata = [_member(wheel, n, path) for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            stated = dict(re.findall(r"^(Name|Version): *(\S+)", metadata[0] if metadata else "", re.M))
            if not any(n.startswith("vllm/") for n in names) or stated.get("Name", "vllm").lower() != "vllm":
                raise UpstreamInputError(f"{path}: not a vLLM wheel (no vllm package in it)")
            if SHARD_FILE not in names:
                raise UpstreamInputError(f"{path}: no {SHARD_FILE} in this wheel")
            return Source(f"{path}!{SHARD_FILE}", _member(wheel, SHARD_FILE, path), stated.get("Version"))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, UnicodeDecodeError, NotImplementedError) as exc:
        raise UpstreamInputError(f"{path}: not a readable wheel: {exc}") from None
