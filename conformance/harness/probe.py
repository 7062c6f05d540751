"""Whether implementations load, asked of a child process.

The process that judges must never import an implementation under test (its
import could patch the checks), so loading is tried in a child:
``python -m shardspec.conformance.harness.probe PROFILE RULES_JSON NAME...`` (the run's profile: its
name and its rules, as data) prints one JSON line per
name, ``{"name", "problem", "warning"}`` (``problem`` null when it loads and implements the
run's profile;
``warning`` when it targets another spec version than the one checked). An import
that exits or kills the child is reported for that name; the names after it
are probed again in a fresh child. Where the run's ranks are forked from a zygote (the CPU), the child is
forked from it too (:meth:`.zygote.Zygote.run_probe`): a fresh Python would import torch once more.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

from shardspec.conformance.api import ImplementationError, load_implementation, profile_refusal
from shardspec.conformance.harness.spawn import describe_exit
from shardspec.spec.loader import target_version_warning
from shardspec.spec.rules import Rules

# How a child runs main(argv): (argv, timeout in s) -> (its output, its exit status or None past the timeout,
# its error output).
ChildRun = Callable[[list[str], float], tuple[str, int | None, str]]


def probe(
    names: list[str],
    rules: Rules,
    timeout_s: float = 120.0,
    warnings: list[str] | None = None,
    releases: dict[str, str] | None = None,
    run_child: ChildRun | None = None,
) -> dict[str, str | None]:
    """name -> why it cannot be loaded (None: it loads); spec-version warnings are appended to ``warnings``,
    and the release each factory says it is (its ``RELEASE``, e.g. "vLLM 0.34.0") put in ``releases``.
    ``run_child``: how a child is run (default: a new Python process)."""
    problems: dict[str, str | None] = {}
    found: list[str] = [] if warnings is None else warnings
    pending = list(dict.fromkeys(names))
    while pending:
        reported, ended = _probe_once(pending, rules, timeout_s, run_child or _new_process)
        problems.update({name: item["problem"] for name, item in reported.items()})
        found += [f"{name}: {item['warning']}" for name, item in reported.items() if item.get("warning")]
        if releases is not None:
            releases.update({name: str(item["release"]) for name, item in reported.items() if item.get("release")})
        pending = [name for name in pending if name not in problems]
        if pending:  # the child died importing the first of them
            problems[pending.pop(0)] = f"importing it ended the process ({ended})"
    return problems


def _probe_once(names: list[str], rules: Rules, timeout_s: float, run_child: ChildRun) -> tuple[dict[str, dict], str]:
    stdout, returncode, stderr = run_child([rules.profile, json.dumps(rules.as_dict()), *names], timeout_s)
    ended = f"it did not finish within {timeout_s:.0f}s" if returncode is None else _describe(returncode, stderr)
    reported = {}
    for line in stdout.splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue  # the implementation printed at import
        if isinstance(item, dict) and item.get("probe") == "shardspec" and item.get("name") in names:
            reported[item["name"]] = item
    return reported, ended


def _new_process(argv: list[str], timeout_s: float) -> tuple[str, int | None, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", __name__, *argv],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        return exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""), None, ""
    return proc.stdout, proc.returncode, proc.stderr


def _describe(returncode: int, stderr: str) -> str:
    tail = stderr.strip().splitlines()[-1:] if stderr else []
    return describe_exit(returncode) + (f": {tail[0]}" if tail else "")


def main(argv: list[str]) -> int:
    rules, names = Rules.of(argv[0], json.loads(argv[1])), argv[2:]  # as the run resolved them
    for name in names:
        problem = warning = release = None
        try:
            impl = load_implementation(name)
            warning = target_version_warning(impl.factory)
            release = getattr(impl.factory, "RELEASE", None)
            problem = profile_refusal(impl, rules)
        except ImplementationError as exc:
            problem = str(exc)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt, or anything an import raises
            problem = f"importing {name!r} raised {type(exc).__name__}: {exc}"
        item = {"probe": "shardspec", "name": name, "problem": problem, "warning": warning, "release": release}
        print(json.dumps(item, default=str), flush=True)
    os._exit(0)  # no atexit handler or thread of an implementation can change the outcome


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
