"""The run's options, from the command line or the environment, validated before anything starts.

Every value is checked here and a bad one is a :class:`UsageError` naming
the option (or the environment variable it came from) and what is wrong.
A variable is read only where its option was not given.
"""

from __future__ import annotations

import math
import os
import pathlib
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from shardspec.spec.profiles import DEFAULT_PROFILE, PROFILES

QUICK_TP_SIZES = [2, 4]
QUICK_MAX_EXAMPLES = 10
# The most generated cases per group size a run draws (hypothesis is asked for three times as many).
MAX_EXAMPLES = 10_000
MIXED_MAX_EXAMPLES = 25
DEFAULT_TP_SIZES = [1, 2, 3, 4, 8]
MAX_TP = 64  # the suite runs every rank on this machine
# Groups whose ranks are threads of one process (harness/inprocess.py, harness/threaded.py).
THREAD_GROUPS = ("lockstep", "torch-threads")


class UsageError(ValueError):
    """A bad option or environment variable; the message names it."""


def _source(option: str, env: str, args, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The raw value and where it came from (``--option`` or ``$ENV``)."""
    value = getattr(args, option.lstrip("-").replace("-", "_"), None)
    if value is not None:
        return value, option
    value = environ.get(env)
    return (value if value not in (None, "") else None), f"${env}"


def _int(text: str, where: str, minimum: int, maximum: int | None = None) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise UsageError(f"{where}: {text!r} is not an integer") from None
    if value < minimum:
        raise UsageError(f"{where}: {value} is below {minimum}")
    if maximum is not None and value > maximum:
        raise UsageError(f"{where}: {value} is above {maximum}")
    return value


def _seconds(text: str, where: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise UsageError(f"{where}: {text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{where}: {text!r} must be a finite number of seconds above 0")
    return value


def _tp_sizes(text: str, where: str) -> list[int]:
    parts = [part.strip() for part in str(text).split(",")]
    if not any(parts) or not all(parts):
        raise UsageError(f"{where}: {text!r} is not a list of group sizes (e.g. 1,2,4)")
    sizes = sorted({_int(part, where, 1) for part in parts})
    if sizes[-1] > MAX_TP:
        raise UsageError(f"{where}: group size {sizes[-1]} is above {MAX_TP}")
    return sizes


def _flag(text: str | None, where: str) -> bool:
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


def _writable_file(path: str, where: str) -> str:
    folder = pathlib.Path(path).expanduser().resolve().parent
    if pathlib.Path(path).is_dir():
        raise UsageError(f"{where}: {path} is a folder, not a file")
    if not folder.is_dir():
        raise UsageError(f"{where}: the folder {folder} does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".shardspec-probe-"):
            pass
    except OSError as exc:
        raise UsageError(f"{where}: cannot write into {folder}: {exc.strerror}") from None
    return path


def _xfails(path: str, where: str) -> str:
    from shardspec.conformance.report.summary import load_xfails

    try:
        load_xfails(path)
    except OSError as exc:
        raise UsageError(f"{where}: cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"{where}: {path}: {exc}") from None
    return path


def _profile(text: str, where: str) -> str:
    name = str(text).strip()
    if name not in PROFILES:
        raise UsageError(f"{where}: unknown profile {name!r}; this spec defines {', '.join(PROFILES)}")
    return name


def _one(args, environ, option: str, env: str, parse: Callable[[str, str], Any], default: Any) -> Any:
    raw, where = _source(option, env, args, environ)
    return default if raw is None else parse(raw, where)


def resolve(args, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Every option's value: command line, else environment, else default; validated."""
    quick = _flag(*_source("--quick", "SHARDSPEC_QUICK", args, environ))
    values = {
        "tp": _one(args, environ, "--tp", "SHARDSPEC_TP", _tp_sizes, QUICK_TP_SIZES if quick else DEFAULT_TP_SIZES),
        "max_examples": _one(
            args,
            environ,
            "--max-examples",
            "SHARDSPEC_MAX_EXAMPLES",
            lambda t, w: _int(t, w, 0, MAX_EXAMPLES),
            QUICK_MAX_EXAMPLES if quick else 100,
        ),
        "seed": _one(args, environ, "--seed", "SHARDSPEC_SEED", lambda t, w: _int(t, w, 0), 0),
        "timeout": _one(args, environ, "--timeout", "SHARDSPEC_TIMEOUT", _seconds, 60.0),
        "xfails_file": _one(args, environ, "--xfails-file", "SHARDSPEC_XFAILS", _xfails, None),
        "json": None if args.json is None else _writable_file(args.json, "--json"),
        "profile": _one(args, environ, "--profile", "SHARDSPEC_PROFILE", _profile, DEFAULT_PROFILE),
    }
    mixed = _one(
        args,
        environ,
        "--mixed-max-examples",
        "SHARDSPEC_MIXED_MAX_EXAMPLES",
        lambda t, w: _int(t, w, 0, MAX_EXAMPLES),
        MIXED_MAX_EXAMPLES,
    )
    values["mixed_max_examples"] = min(values["max_examples"], mixed)
    values["pg_timeout"] = (
        _seconds(args.pg_timeout, "--pg-timeout") if args.pg_timeout is not None else values["timeout"]
    )
    impl, where = _source("--impl", "SHARDSPEC_IMPL", args, environ)
    if impl is not None and not impl.replace(",", "").strip():
        raise UsageError(f"{where}: {impl!r} names no implementation")
    values["impl"] = impl
    values["impl_odd"] = _source("--impl-odd", "SHARDSPEC_IMPL_ODD", args, environ)[0]
    _check_run_dir(args.run_dir)
    if getattr(args, "launcher", None) == "external":
        if len(values["tp"]) != 1:
            raise UsageError(f"--launcher external: one group size (the launch's world size), not {values['tp']}")
        if args.run_dir is None:
            raise UsageError("--launcher external: give a --run-dir that every node can read and write")
    return values


def _check_run_dir(run_dir: pathlib.Path | None) -> None:
    """A run never reads files an earlier run left: its folder must be new or empty."""
    if run_dir is None:
        return
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise UsageError(f"--run-dir: {run_dir} is not an empty folder (a run never reuses an earlier run's files)")
