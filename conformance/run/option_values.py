"""How an option's text becomes its value: each reader takes the text and where it came from (the
flag, or ``$VARIABLE``) and returns the value, or raises a UsageError naming that place and what is
wrong.

Light imports only, as for the table (options.py): the pytest plugin loads them in every pytest session.
"""

from __future__ import annotations

import math
import os
import pathlib

from shardspec.conformance.api import ImplChoice, ImplementationError, implementation_names
from shardspec.conformance.output_paths import ReportPathError, check_report_path, check_run_dir
from shardspec.conformance.usage import MAX_EXAMPLES, MAX_TIMEOUT_S, MAX_TP, MIN_TIMEOUT_S, UsageError
from shardspec.spec.profiles import PROFILES, ProfileError, load_profile_file, profile_names


def integer(text: str, where: str, minimum: int, maximum: int | None = None) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise UsageError(f"{where}: {text!r} is not an integer") from None
    if value < minimum:
        raise UsageError(f"{where}: {value} is below {minimum}")
    if maximum is not None and value > maximum:
        raise UsageError(f"{where}: {value} is above {maximum}")
    return value


def seconds(text: str, where: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise UsageError(f"{where}: {text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{where}: {text!r} must be a finite number of seconds above 0")
    if value < MIN_TIMEOUT_S:
        raise UsageError(
            f"{where}: {text!r} is below {MIN_TIMEOUT_S:g} second, the least a case needs to start (every case "
            "would time out)"
        )
    if value > MAX_TIMEOUT_S:
        raise UsageError(f"{where}: {text!r} is above {MAX_TIMEOUT_S:g} seconds (one day; a hang would never end)")
    return value


def tp_sizes(text: str, where: str) -> list[int]:
    parts = [part.strip() for part in str(text).split(",")]
    if not any(parts) or not all(parts):
        raise UsageError(f"{where}: {text!r} is not a list of group sizes (e.g. 1,2,4)")
    sizes = sorted({integer(part, where, 1) for part in parts})
    if sizes[-1] > MAX_TP:
        raise UsageError(f"{where}: group size {sizes[-1]} is above {MAX_TP}")
    return sizes


def flag(text: str | None, where: str) -> bool:
    if text is None or text is False:
        return False
    if text is True:
        return True
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise UsageError(f"{where}: {text!r} is not a boolean (1/0, true/false)")


def report_file(path: str, where: str) -> str:
    """A file the JSON report may be written to: nothing there yet, or an earlier report (output_paths.py)."""
    try:
        check_report_path(path)
    except ReportPathError as exc:
        raise UsageError(f"{where}: {exc}") from None
    return path


def xfails(path: str, where: str) -> str:
    # The xfails file's format (report/xfails.py) loads torch through spec/guarantees.py, and this module loads
    # in every pytest session (the plugin's options): it loads when an xfails file is named.
    from shardspec.conformance.report.xfails import load_xfails

    try:
        load_xfails(path)
    except OSError as exc:
        raise UsageError(f"{where}: cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"{where}: {path}: {exc}") from None
    return path


def profile(text: str, where: str) -> str:
    name = str(text).strip()
    if name not in profile_names():
        raise UsageError(f"{where}: unknown profile {name!r}; this spec defines {', '.join(PROFILES)}")
    return name


def profile_file(text: str, where: str) -> str:
    """A profile file's name, the file read once, as untrusted input, and registered for this process (the
    processes a run starts receive its rules as data with their jobs)."""
    try:
        loaded = load_profile_file(os.path.abspath(str(text).strip()))
    except ProfileError as exc:
        raise UsageError(f"{where}: {exc}") from None
    return loaded.name


def impl(text: str, where: str) -> list[str]:
    if not str(text).replace(",", "").strip():
        raise UsageError(f"{where}: {text!r} names no implementation")
    try:
        return implementation_names(str(text))
    except ImplementationError as exc:
        raise UsageError(f"{where}: {exc}") from None


def impl_odd(text: str, where: str) -> str:
    name = str(text).strip()
    try:
        if not name or ImplChoice.parse(name).mixed:
            raise ImplementationError(f"{text!r} is not one implementation")
    except ImplementationError as exc:
        raise UsageError(f"{where}: {exc}") from None
    return name


def run_dir(text: str, where: str) -> pathlib.Path:
    """A run never reads files an earlier run left: its folder must be new (it is made here) or empty, and
    no link (output_paths.py)."""
    try:
        return check_run_dir(text)
    except ReportPathError as exc:
        raise UsageError(f"{where}: {exc}") from None


def text(value: str, where: str) -> str:
    return str(value)


def bounded_examples(text: str, where: str) -> int:
    return integer(text, where, 0, MAX_EXAMPLES)
