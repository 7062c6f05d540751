"""Mutation testing of reference/ and the Python of impl/ with mutmut, judged by a fast test profile.

    python mutation/run.py [reference] [impl] [--max-children 1] [--worktree]

mutmut names a mutant after its file's path and swaps in mutants by module name, so it needs the
package laid out the way it is imported. This repository maps folders onto ``shardspec.*``
(``package-dir`` in pyproject.toml), so the driver copies a snapshot (the commit at HEAD, or the
working tree with ``--worktree``) into build/mutation/ as ``src/shardspec/...`` and runs mutmut
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
from report import collect_results, load_reasons, print_summary, write_report  # noqa: E402

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


def export_files(dest: Path, worktree: bool) -> None:
    """The repository's files at HEAD (or as they are now, with worktree) into dest."""
    if worktree:
        listing = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                                 capture_output=True).stdout.decode().split("\0")
        for name in filter(None, listing):
            if (ROOT / name).is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, dest / name)
        return
    archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")


def lay_out_snapshot(snapshot: Path, worktree: bool) -> None:
    """snapshot/src/shardspec/<sub>/ for every mapped folder, plus the tests and what they read."""
    if snapshot.exists():
        shutil.rmtree(snapshot)
    raw = snapshot.with_name(snapshot.name + "-files")
    if raw.exists():
        shutil.rmtree(raw)
    raw.mkdir(parents=True)
    export_files(raw, worktree)
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


def run_mutmut(snapshot: Path, target: str, max_children: int) -> float:
    """mutmut over one folder's mutants; returns the wall time in seconds."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    # The repository's own checkout must not shadow the snapshot's package.
    env.pop("PYTHONPATH", None)
    started = time.monotonic()
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), f"shardspec.{target}.*"]
    print("$", " ".join(command), f"(in {snapshot.relative_to(ROOT)})", flush=True)
    subprocess.run(command, cwd=snapshot, env=env, check=True)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", metavar="FOLDER",
                        help=f"folders to mutate, in this order: {' '.join(TARGETS)} (default: both)")
    parser.add_argument("--max-children", type=int, default=1, help="parallel mutant runs (default 1)")
    parser.add_argument("--worktree", action="store_true", help="snapshot the working tree instead of HEAD")
    parser.add_argument("--reuse", action="store_true",
                        help="keep build/mutation/ from the last run: mutants already judged are not run again")
    args = parser.parse_args(argv)
    args.targets = args.targets or list(TARGETS)
    unknown = sorted(set(args.targets) - set(TARGETS))
    if unknown:
        parser.error(f"unknown folder(s) {unknown}: choose from {list(TARGETS)}")
    snapshot = WORK / "snapshot"
    if not (args.reuse and snapshot.exists()):
        lay_out_snapshot(snapshot, args.worktree)
    seconds = {target: run_mutmut(snapshot, target, args.max_children) for target in args.targets}
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
