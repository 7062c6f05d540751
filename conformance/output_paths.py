"""Where a run writes: the JSON report (``--json``) and the run's folder (``--run-dir``).

A run writes only regular files and folders it creates, or a report of its own it replaces: never through
a symbolic link, never into a device, a FIFO or a socket, never over a file that is not a report of this
suite (CI runs as root; a mistyped path must not replace a system file). A report is recognised by its
first key, ``"report": "shardspec.conformance"`` (reports written before it had none: those are recognised
by their shape, a ``metadata`` object naming the ``spec_version`` and a list of ``sections``).

Light imports only: the options' readers (run/option_values.py) check both paths before anything starts, and
the session checks the report's path again when it writes it.
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import stat
import tempfile

REPORT_MARKER = "shardspec.conformance"
# The run's claim on its folder: made first (O_EXCL), locked (flock) while the run lives.
RUN_LOCK = ".shardspec-run.lock"
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


def is_junit_report(path: pathlib.Path) -> bool:
    """Whether the regular file ``path`` holds a JUnit XML report (pytest's ``--junitxml``)."""
    try:
        with open(path, "rb") as stream:
            head = stream.read(4096).lstrip()
    except OSError:
        return False
    return head.startswith(b"<?xml") and (b"<testsuites" in head or b"<testsuite" in head)


def check_report_path(path: str | os.PathLike, ours=is_report, what: str = "a report of this suite") -> pathlib.Path:
    """``path`` if a report may be written there (nothing there, or a report ``ours`` recognises: by default
    a JSON report of this suite), else a ReportPathError saying why not. The folder must exist and take a
    new file."""
    file = pathlib.Path(path).expanduser()
    found = _lstat(file)
    if found is not None:
        if stat.S_ISLNK(found.st_mode):
            raise ReportPathError(f"{file} is a symbolic link; the report is written only to a regular file")
        if stat.S_ISDIR(found.st_mode):
            raise ReportPathError(f"{file} is a folder, not a file")
        if not stat.S_ISREG(found.st_mode):
            raise ReportPathError(f"{file} is {_kind(found.st_mode)}, not a regular file")
        if not ours(file):
            raise ReportPathError(f"{file} exists and is not {what}; the run replaces only its own reports")
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
    """The run's folder, made here if new (with its parents), and claimed by this process: a lock file made
    first in it and locked until the run ends (release_run_dir) or the process exits; a second run there,
    even one started at the same moment, is refused. An existing folder must be empty and not a link. A
    ReportPathError names the path and why otherwise."""
    folder = pathlib.Path(path).expanduser()
    found = _lstat(folder)
    if found is None:
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            return check_run_dir(folder)  # made meanwhile: checked as an existing one
        except OSError as exc:
            raise ReportPathError(f"{folder} cannot create the folder: {exc.strerror}") from None
        return _claim(folder)
    if stat.S_ISLNK(found.st_mode):
        raise ReportPathError(f"{folder} is a symbolic link; give the folder itself")
    if not stat.S_ISDIR(found.st_mode):
        kind = "a regular file" if stat.S_ISREG(found.st_mode) else _kind(found.st_mode)
        raise ReportPathError(f"{folder} is {kind}, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ReportPathError(f"{folder} is not writable")
    return _claim(folder)


_UNUSED = "is not an empty folder (a run never reuses an earlier run's files)"


def _claim(folder: pathlib.Path) -> pathlib.Path:
    """``folder`` with its lock file made by this process (O_EXCL: of two runs, one makes it) and locked;
    any other entry there means an earlier run's files, and the claim is given up."""
    lock = folder / RUN_LOCK
    try:
        descriptor = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        if _held_elsewhere(lock):
            raise ReportPathError(f"{folder} is in use by another run (its lock file {RUN_LOCK} is held)") from None
        raise ReportPathError(f"{folder} {_UNUSED}") from None
    except OSError as exc:
        raise ReportPathError(f"{folder} cannot be written: {exc.strerror}") from None
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # made here: no other process has it open
    try:
        used = any(entry.name != RUN_LOCK for entry in folder.iterdir())
        why = f"{folder} {_UNUSED}"
    except OSError as exc:
        used, why = True, f"{folder} cannot be read: {exc.strerror}"
    if used:
        os.close(descriptor)
        lock.unlink(missing_ok=True)
        raise ReportPathError(why)
    os.write(descriptor, f"{os.getpid()}\n".encode())
    _CLAIMS[folder.resolve()] = descriptor
    return folder


# The folders this process claimed, and their lock's descriptor: open for as long as the run uses the folder
# (closing it releases the lock). Forked ranks inherit it: a rank left alive keeps the folder claimed.
_CLAIMS: dict[pathlib.Path, int] = {}


def _held_elsewhere(lock: pathlib.Path) -> bool:
    try:
        descriptor = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)
    return False


def release_run_dir(path: str | os.PathLike, unused: bool = False) -> None:
    """The run that claimed ``path`` in this process is over: its lock is released. The lock file stays (the
    folder is never taken for an unused one), unless the run never started (``unused``: a usage error came
    after the folder was claimed), so that the corrected command may use it."""
    folder = pathlib.Path(path).expanduser()
    descriptor = _CLAIMS.pop(folder.resolve(), None)
    if descriptor is None:
        return
    if unused:
        (folder / RUN_LOCK).unlink(missing_ok=True)
    os.close(descriptor)
