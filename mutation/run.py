"""Mutation testing of reference/ and the Python of impl/ with mutmut, judged by a fast test profile.

    python mutation/run.py [reference] [impl] [--max-children 1] [--rev REV | --worktree] [--reuse] [--take PATH...]

mutmut names a mutant after its file's path and swaps in mutants by module name, so it needs the
package laid out the way it is imported. This repository maps folders onto ``shardspec.*``
(``package-dir`` in pyproject.toml), so the driver copies a snapshot (a commit, HEAD by default, or
the working tree with ``--worktree``) into build/mutation/ as ``src/shardspec/...`` and runs mutmut
there: the files in the repository are never touched, and edits made meanwhile do not leak in.
mutmut's settings, including the test profile, are ``[tool.mutmut]`` in pyproject.toml.

Prints killed / survived / timed out per folder, writes every mutant that was not killed, with its
diff and the reason it may survive (from docs/mutation-survivors.md), to reports/mutants.md, and
exits 1 if a survivor of reference/ has no reason.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: mutmut depends on toml there
    import toml as tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import CAUGHT, collect_results, load_reasons, print_summary, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "mutation"
REPORT = ROOT / "reports" / "mutants.md"
REASONS = ROOT / "docs" / "mutation-survivors.md"
TARGETS = ("reference", "impl")
# Beside the package: what the tests read through paths relative to themselves.
EXTRA_PATHS = ("tests", "examples", "pyproject.toml")


def package_dirs(pyproject: Path) -> dict[str, str]:
    """``shardspec.x`` -> its folder in the repository, from pyproject's package-dir."""
    return tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-dir"]


def export_files(dest: Path, rev: str | None) -> None:
    """The repository's files at commit rev (or as they are now in the working tree, rev None) into dest."""
    if rev is None:
        listing = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                                 capture_output=True).stdout.decode().split("\0")
        for name in filter(None, listing):
            if (ROOT / name).is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, dest / name)
        return
    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT, check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")


def lay_out_snapshot(snapshot: Path, rev: str | None) -> None:
    """snapshot/src/shardspec/<sub>/ for every mapped folder, plus the tests and what they read."""
    if snapshot.exists():
        shutil.rmtree(snapshot)
    raw = snapshot.with_name(snapshot.name + "-files")
    if raw.exists():
        shutil.rmtree(raw)
    raw.mkdir(parents=True)
    export_files(raw, rev)
    # Longest names first would matter for nested mappings; "shardspec" itself must come first.
    for package, folder in sorted(package_dirs(raw / "pyproject.toml").items()):
        target = snapshot / "src" / Path(*package.split("."))
        shutil.copytree(raw / folder, target, dirs_exist_ok=True)
    for name in EXTRA_PATHS:
        source = raw / name
        if source.is_dir():
            shutil.copytree(source, snapshot / name)
        elif source.is_file():
            shutil.copy2(source, snapshot / name)
    shutil.rmtree(raw)


def take_files(snapshot: Path, paths: list[str]) -> None:
    """Copy files from the working tree into the snapshot (e.g. new tests for the survivors of the last run)."""
    for name in paths:
        source = (ROOT / name).resolve()
        if not source.is_file() or ROOT not in source.parents:
            raise SystemExit(f"--take {name}: not a file of the repository")
        target = snapshot / source.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def not_caught(snapshot: Path, target: str) -> list[str]:
    """Names of the target's mutants that the last run did not catch (or did not reach)."""
    return [m.name for m in collect_results(snapshot, [target], with_diffs=False) if m.status not in CAUGHT]


def run_mutmut(snapshot: Path, target: str, max_children: int, names: list[str] | None = None) -> float:
    """mutmut over one folder's mutants (only ``names`` if given); returns the wall time in seconds."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    # The repository's own checkout must not shadow the snapshot's package.
    env.pop("PYTHONPATH", None)
    started = time.monotonic()
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)]
    command += names if names is not None else [f"shardspec.{target}.*"]
    print("$", " ".join(command[:7]), "..." if len(command) > 7 else "", f"(in {snapshot.relative_to(ROOT)})",
          flush=True)
    subprocess.run(command, cwd=snapshot, env=env, check=True)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", metavar="FOLDER",
                        help=f"folders to mutate, in this order: {' '.join(TARGETS)} (default: both)")
    parser.add_argument("--max-children", type=int, default=1, help="parallel mutant runs (default 1)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--rev", default="HEAD", help="the commit to snapshot (default HEAD)")
    source.add_argument("--worktree", action="store_true", help="snapshot the working tree instead of a commit")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the snapshot and results of the last run and run again only the mutants it did "
                             "not catch")
    parser.add_argument("--take", nargs="+", default=[], metavar="PATH",
                        help="files to copy from the working tree into the snapshot first (e.g. new tests)")
    args = parser.parse_args(argv)
    args.targets = args.targets or list(TARGETS)
    unknown = sorted(set(args.targets) - set(TARGETS))
    if unknown:
        parser.error(f"unknown folder(s) {unknown}: choose from {list(TARGETS)}")
    snapshot = WORK / "snapshot"
    reuse = args.reuse and (snapshot / "mutants").exists()
    if not reuse:
        lay_out_snapshot(snapshot, None if args.worktree else args.rev)
    take_files(snapshot, args.take)
    seconds = {}
    for target in args.targets:
        names = not_caught(snapshot, target) if reuse else None
        if names == []:
            print(f"{target}: every mutant was caught in the last run")
            seconds[target] = 0.0
            continue
        seconds[target] = run_mutmut(snapshot, target, args.max_children, names)
    results = collect_results(snapshot, args.targets)
    reasons = load_reasons(REASONS)
    unjustified = write_report(REPORT, results, reasons)
    print_summary(results, seconds)
    print(f"survivors and their reasons: {REPORT.relative_to(ROOT)}")
    missing = [name for name in unjustified if name.startswith("shardspec.reference.")]
    if missing:
        print(f"{len(missing)} survivor(s) of reference/ without a reason in {REASONS.relative_to(ROOT)}:")
        for name in missing:
            print("  ", name)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
