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
exits 1 if a survivor of a folder it ran has no reason (docs/mutation-survivors.md says which modules
were measured when). Every module of a folder is mutated; ``--mutants 'shardspec.impl.gather.*'`` runs
one module's mutants only.
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
from report import CAUGHT, NOT_RUN, collect_results, load_reasons, print_summary, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "mutation"
REPORT = ROOT / "reports" / "mutants.md"
REASONS = ROOT / "docs" / "mutation-survivors.md"
FOLDERS = ("reference", "impl")
# Beside the package: what the tests read through paths relative to themselves.
EXTRA_PATHS = ("tests", "examples", "pyproject.toml")


def package_dirs(pyproject: Path) -> dict[str, str]:
    """``shardspec.x`` -> its folder in the repository, from pyproject's package-dir."""
    return tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-dir"]


def export_files(dest: Path, rev: str | None) -> None:
    """The repository's files at commit rev (or as they are now in the working tree, rev None) into dest."""
    if rev is None:
        listing = (
            subprocess.run(
                ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True
            )
            .stdout.decode()
            .split("\0")
        )
        for name in filter(None, listing):
            if (ROOT / name).is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, dest / name)
        return
    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT, check=True, capture_output=True).stdout
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


def write_mutmut_config(snapshot: Path, folder: str) -> None:
    """setup.cfg [mutmut] for one folder, from [tool.shardspec.mutants] of the snapshot's pyproject.toml."""
    settings = tomllib.loads((snapshot / "pyproject.toml").read_text())["tool"]["shardspec"]["mutants"]
    values = {key: value for key, value in settings.items() if not isinstance(value, dict)}
    values["source_paths"] = [f"src/shardspec/{folder}"]
    values["pytest_add_cli_args_test_selection"] = settings[folder]["tests"]
    lines = ["[mutmut]"]
    for key, value in values.items():
        items = value if isinstance(value, list) else [value]
        lines.append(f"{key} =" + "".join(f"\n    {item}" for item in items))
    (snapshot / "setup.cfg").write_text("\n".join(lines) + "\n")


def not_caught(snapshot: Path, folder: str) -> list[str]:
    """Names of the folder's mutants that the last run judged and did not catch."""
    results = collect_results(snapshot, [folder], with_diffs=False)
    return [m.name for m in results if m.status not in CAUGHT and m.status != NOT_RUN]


def sample_pattern(folder: str, every: int) -> str:
    """The mutants of the folder whose number's last digit is a multiple of ``every`` (1, 2, 5 or 10)."""
    digits = "".join(str(d) for d in range(10) if d % every == 0)
    return f"shardspec.{folder}.*__mutmut_*[{digits}]"


def run_mutmut(snapshot: Path, max_children: int, names: list[str]) -> float:
    """mutmut over the named mutants (fnmatch patterns); returns the wall time in seconds."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    # The repository's own checkout must not shadow the snapshot's package.
    env.pop("PYTHONPATH", None)
    started = time.monotonic()
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *names]
    shown = " ".join(command[:7]) + (f" ... ({len(names)} names)" if len(names) > 1 else "")
    print("$", shown, f"(in {snapshot.relative_to(ROOT)})", flush=True)
    subprocess.run(command, cwd=snapshot, env=env, check=True)
    return time.monotonic() - started


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "folders",
        nargs="*",
        metavar="FOLDER",
        help=f"folders to mutate, in this order: {' '.join(FOLDERS)} (default: both)",
    )
    parser.add_argument("--max-children", type=int, default=1, help="parallel mutant runs (default 1)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--rev", default="HEAD", help="the commit to snapshot (default HEAD)")
    source.add_argument("--worktree", action="store_true", help="snapshot the working tree instead of a commit")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the snapshot and results of the last run and run again only the mutants it did not catch",
    )
    parser.add_argument(
        "--take",
        nargs="+",
        default=[],
        metavar="PATH",
        help="files to copy from the working tree into the snapshot first (e.g. new tests)",
    )
    parser.add_argument(
        "--sample",
        type=int,
        choices=[1, 2, 5, 10],
        default=1,
        help="run 1 mutant in N (by the last digit of mutmut's number), for a quick estimate",
    )
    parser.add_argument(
        "--mutants",
        nargs="+",
        metavar="NAME",
        help="run exactly these mutants (mutmut names or fnmatch patterns), e.g. to resume a run",
    )
    parser.add_argument("--report-only", action="store_true", help="run nothing: report the last run's results")
    args = parser.parse_args(argv)
    args.folders = args.folders or list(FOLDERS)
    unknown = sorted(set(args.folders) - set(FOLDERS))
    if unknown:
        parser.error(f"unknown folder(s) {unknown}: choose from {list(FOLDERS)}")
    return args


def run_folder(folder: str, args: argparse.Namespace) -> float:
    snapshot = WORK / folder
    reuse = args.reuse and (snapshot / "mutants").exists()
    if not reuse:
        lay_out_snapshot(snapshot, None if args.worktree else args.rev)
        write_mutmut_config(snapshot, folder)
    take_files(snapshot, args.take)
    if args.mutants:
        names = [name for name in args.mutants if name.startswith(f"shardspec.{folder}.")]
    else:
        names = not_caught(snapshot, folder) if reuse else [sample_pattern(folder, args.sample)]
    if not names:
        print(f"{folder}: every mutant was caught in the last run")
        return 0.0
    return run_mutmut(snapshot, args.max_children, names)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seconds = {folder: 0.0 if args.report_only else run_folder(folder, args) for folder in args.folders}
    results = [m for folder in args.folders for m in collect_results(WORK / folder, [folder])]
    reasons = load_reasons(REASONS)
    unjustified = write_report(REPORT, results, reasons)
    print_summary(results, seconds)
    print(f"survivors and their reasons: {REPORT.relative_to(ROOT)}")
    survivors = {(m.function, m.mutated) for m in results if m.status not in CAUGHT and m.status != NOT_RUN}
    stale = [key for key in reasons if key[0].split(".")[1] in args.folders and key not in survivors]
    if stale:
        print(f"{len(stale)} reason(s) in {REASONS.relative_to(ROOT)} match no mutant that survived; e.g. {stale[0]}")
    if unjustified:
        print(f"{len(unjustified)} survivor(s) without a reason in {REASONS.relative_to(ROOT)}:")
        for name in unjustified:
            print("  ", name)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
