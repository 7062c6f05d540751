"""Benchmark results for the HTML report: JSON as tables, text tables as they are, PNG plots copied.

The scripts of ``bench/`` write JSON of several shapes (a list of timed rows,
nested counts per implementation and step, settings), so the JSON is laid out
by its shape rather than by script:

- a mapping of scalars (``environment``, ``settings``) -> a two-column table;
- a list of mappings (``rows``) -> one table; a row's nested mappings of
  scalars become lines of their own, keyed by the row's scalars
  (``tp 8, num_reqs 1024`` x ``production.step`` -> ``wall_us``, ``gpu_us``);
- nested mappings down to mappings of scalars (``counts``) -> one line per path.
"""

from __future__ import annotations

import json
import pathlib
import shutil
from dataclasses import dataclass, field
from typing import Any

from shardspec.conformance.report.model import ReportError

BENCH_SUFFIXES = (".json", ".png", ".txt")
MAX_TEXT = 200_000  # characters of one text table shown in the page


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]


@dataclass
class BenchFile:
    name: str
    path: pathlib.Path
    kind: str  # json | png | txt
    tables: list[Table] = field(default_factory=list)
    text: str | None = None
    image: str | None = None  # path of the copied plot, relative to the report folder


def collect_bench_files(paths: list[str]) -> list[pathlib.Path]:
    """Files as given, and the JSON, PNG and text files directly inside given folders."""
    found = []
    for raw in paths:
        path = pathlib.Path(raw)
        if path.is_dir():
            inside = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in BENCH_SUFFIXES)
            if not inside:
                raise ReportError(f"{path}: no benchmark results (*.json, *.png, *.txt) in this folder")
            found += inside
        elif not path.exists():
            raise ReportError(f"{path}: no such file")
        elif path.suffix.lower() not in BENCH_SUFFIXES:
            raise ReportError(f"{path}: not a benchmark result (expected .json, .png or .txt)")
        else:
            found.append(path)
    return list(dict.fromkeys(found))


def load_bench(paths: list[str], out_dir: pathlib.Path) -> list[BenchFile]:
    """Read the benchmark files; plots are copied under ``out_dir/bench/``."""
    files, used = [], set()
    for path in collect_bench_files(paths):
        kind = path.suffix.lower().lstrip(".")
        entry = BenchFile(path.name, path, kind)
        if kind == "json":
            entry.tables = json_tables(_read_json(path))
        elif kind == "txt":
            entry.text = _read_text(path)
        else:
            entry.image = _copy_plot(path, out_dir, used)
        files.append(entry)
    return files


def _read_json(path: pathlib.Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None


def _read_text(path: pathlib.Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot be read as text ({exc})") from None
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "\n... (cut)\n"


def _copy_plot(path: pathlib.Path, out_dir: pathlib.Path, used: set[str]) -> str:
    with open(path, "rb") as handle:
        if handle.read(8) != b"\x89PNG\r\n\x1a\n":
            raise ReportError(f"{path}: not a PNG image")
    name = path.name
    while name in used:  # two folders may hold plots of one name
        name = f"{path.parent.name}-{name}"
    used.add(name)
    target = out_dir / "bench" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise ReportError(f"{target} is a symbolic link or not a regular file; plots are copied only as files")
    shutil.copyfile(path, target)
    return f"bench/{name}"


# -- JSON laid out as tables -------------------------------------------------------


def json_tables(data: Any) -> list[Table]:
    if not isinstance(data, dict):
        data = {"results": data}
    tables = []
    top_scalars = {k: v for k, v in data.items() if _scalar(v)}
    if top_scalars:
        tables.append(_key_values("summary", top_scalars))
    for key, value in data.items():
        if _scalar(value):
            continue
        if isinstance(value, dict) and all(_scalar(v) for v in value.values()):
            tables.append(_key_values(key, value))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            tables.append(_row_table(key, value))
        elif isinstance(value, dict):
            tables.append(_path_table(key, value))
        else:
            tables.append(Table(key, ["value"], [[_format(value)]]))
    return tables


def _scalar(value: Any) -> bool:
    return (
        value is None
        or isinstance(value, (str, int, float, bool))
        or (isinstance(value, list) and all(v is None or isinstance(v, (str, int, float, bool)) for v in value))
    )


def _format(value: Any) -> str:
    if isinstance(value, float):  # counts are stored as floats: show them as integers
        if value.is_integer():
            return str(int(value))
        return f"{value:.1f}" if abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, list):
        return ", ".join(_format(v) for v in value)
    return "" if value is None else str(value)


def _key_values(title: str, mapping: dict) -> Table:
    return Table(title, ["key", "value"], [[str(k), _format(v)] for k, v in mapping.items()])


def _row_table(title: str, rows: list[dict]) -> Table:
    """Scalars of each row as its key; each nested mapping of scalars a line of its own."""
    lines: list[dict[str, Any]] = []
    for row in rows:
        keys = {k: v for k, v in row.items() if _scalar(v)}
        nested = {k: v for k, v in row.items() if isinstance(v, dict)}
        if not nested:
            lines.append(keys)
        for name, leaf in _leaves(nested):
            lines.append({**keys, "series": name, **leaf})
    return _table_of(title, lines)


def _path_table(title: str, tree: dict) -> Table:
    return _table_of(title, [{"path": name, **leaf} for name, leaf in _leaves(tree)])


def _leaves(tree: dict, prefix: str = "") -> list[tuple[str, dict]]:
    """(dotted path, mapping of scalars) for each innermost mapping of ``tree``."""
    found = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if not isinstance(value, dict):
            continue
        if all(_scalar(v) for v in value.values()):
            found.append((path, value))
        else:
            found += _leaves(value, path + ".")
    return found


def _table_of(title: str, lines: list[dict[str, Any]]) -> Table:
    columns = list(dict.fromkeys(k for line in lines for k in line))
    return Table(title, columns, [[_format(line.get(c)) for c in columns] for line in lines])
