"""Where a run writes: the JSON report (``--json``) and the run's folder (``--run-dir``).

A run writes only regular files and folders it creates, or a report of its own it replaces: never through
a symbolic link, never into a device, a FIFO or a socket, never over a file that is not a report of this
suite (CI runs as root; a mistyped path must not replace a system file). A report is recognised by its
first key, ``"report": "shardspec.conformance"`` (reports written before it had none: those are recognised
by their shape, a ``metadata`` object naming the ``spec_version`` and a list of ``sections``).

Light imports only: the options' readers (option_values.py) check both paths before anything starts, and
the session checks the report's path again when it writes it.
"""

from __future__ import annotations

import json
import os
import pathlib
import stat
import tempfile

REPORT_MARKER = "shardspec.conformance"
# A report larger than this is not read to find out whether it is one (reports of the default run are a few MB).
MAX_REPORT_BYTES = 256 << 20

_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


class ReportPathError(ValueError):
    """A path a run will not write; the message names the path and why."""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _lstat(path: pathlib.Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ReportPathError(f"{path}: {exc.strerror}") from None


def is_report(path: pathlib.Path) -> bool:
    """Whether the regular file ``path`` holds a JSON report of this suite."""
    try:
        if os.lstat(path).st_size > MAX_REPORT_BYTES:
            return False
        with open(path, "rb") as stream:
            data = json.loads(stream.read(MAX_REPORT_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return False
    if not isinstance(data, dict):
        return False
    if data.get("report") == REPORT_MARKER:
        return True
    metadata = data.get("metadata")
    return isinstance(metadata, dict) and "spec_version" in metadata and isinstance(data.get("sections"), list)


def check_report_path(path: str | os.PathLike) -> pathlib.Path:
    """``path`` if a report may be written there (nothing there, or a report of this suite), else a
    ReportPathError saying why not. The folder must exist and take a new file."""
    file = pathlib.Path(path).expanduser()
    found = _lstat(file)
    if found is not None:
        if stat.S_ISLNK(found.st_mode):
            raise ReportPathError(f"{file} is a symbolic link; the report is written only to a regular file")
        if stat.S_ISDIR(found.st_mode):
            raise ReportPathError(f"{file} is a folder, not a file")
        if not stat.S_ISREG(found.st_mode):
            raise ReportPathError(f"{file} is {_kind(found.st_mode)}, not a regular file")
        if not is_report(file):
            raise ReportPathError(
                f"{file} exists and is not a report of this suite; the run replaces only its own reports"
            )
    folder = file.parent
    if not folder.is_dir():
        raise ReportPathError(f"the folder {folder.resolve()} does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".shardspec-probe-"):
            pass
    except OSError as exc:
        raise ReportPathError(f"cannot write into {folder.resolve()}: {exc.strerror}") from None
    return file


def write_report(path: str | os.PathLike, text: str) -> None:
    """``text`` into ``path``, checked again (it may have changed since the run started); readers see the
    old report or the new one, never half of one. The new file is made where no link can redirect it."""
    file = check_report_path(path)
    descriptor, partial = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.", suffix=".partial")
    try:
        with os.fdopen(descriptor, "w") as stream:
            stream.write(text)
        os.chmod(partial, 0o644)
        os.replace(partial, file)  # a rename: it replaces a link or file at ``file`` itself, never a target
    except BaseException:
        pathlib.Path(partial).unlink(missing_ok=True)
        raise


def check_run_dir(path: str | os.PathLike) -> pathlib.Path:
    """The run's folder, made here if new (with its parents); an existing one must be an empty folder, not a
    link. A ReportPathError names the path and why otherwise."""
    folder = pathlib.Path(path).expanduser()
    found = _lstat(folder)
    if found is None:
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            return check_run_dir(folder)  # made meanwhile: checked as an existing one
        except OSError as exc:
            raise ReportPathError(f"{folder} cannot create the folder: {exc.strerror}") from None
        return folder
    if stat.S_ISLNK(found.st_mode):
        raise ReportPathError(f"{folder} is a symbolic link; give the folder itself")
    if not stat.S_ISDIR(found.st_mode):
        kind = "a regular file" if stat.S_ISREG(found.st_mode) else _kind(found.st_mode)
        raise ReportPathError(f"{folder} is {kind}, not a folder")
    try:
        used = any(folder.iterdir())
    except OSError as exc:
        raise ReportPathError(f"{folder} cannot be read: {exc.strerror}") from None
    if used:
        raise ReportPathError(f"{folder} is not an empty folder (a run never reuses an earlier run's files)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ReportPathError(f"{folder} is not writable")
    return folder
