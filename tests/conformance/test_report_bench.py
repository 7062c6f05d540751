"""Benchmark results in the HTML report: JSON laid out as tables, plots copied, bad input named."""

import json

import pytest
from png import png_size, tiny_png

from shardspec.conformance.report.bench import collect_bench_files, json_tables, load_bench
from shardspec.conformance.report.model import ReportError

TIMED = {  # the shape bench_step.py writes (trimmed)
    "environment": {"torch": "2.11.0", "device_name": "NVIDIA H200"},
    "rows": [
        {
            "tp": 8,
            "num_reqs": 1024,
            "production.step": {"wall_us": 167.04, "iters": 600},
            "reference.step": {"wall_us": 3001.5, "iters": 40},
        }
    ],
}
COUNTS = {
    "shape": {"tp": 8},
    "counts": {
        "production": {"step": {"python": 53.0, "syncs": 0.0}},
        "upstream": {"step": {"python": 158.0, "syncs": 0.0}},
    },
}


def test_timed_rows_become_one_line_per_series():
    tables = {t.title: t for t in json_tables(TIMED)}
    assert tables["environment"].rows == [["torch", "2.11.0"], ["device_name", "NVIDIA H200"]]
    rows = tables["rows"]
    assert rows.columns == ["tp", "num_reqs", "series", "wall_us", "iters"]
    assert rows.rows == [
        ["8", "1024", "production.step", "167.0", "600"],
        ["8", "1024", "reference.step", "3001.5", "40"],
    ]


def test_nested_counts_become_one_line_per_path():
    counts = next(t for t in json_tables(COUNTS) if t.title == "counts")
    assert counts.columns == ["path", "python", "syncs"]
    assert counts.rows == [["production.step", "53", "0"], ["upstream.step", "158", "0"]]


def test_files_and_folders_are_read_and_plots_copied(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "h200.json").write_text(json.dumps(TIMED))
    (results / "h200.txt").write_text("tp  step_us\n8   167\n")
    (results / "step.png").write_bytes(tiny_png(5, 2))
    (results / "notes.md").write_text("not a result")
    out = tmp_path / "site"
    files = {f.name: f for f in load_bench([str(results)], out)}
    assert set(files) == {"h200.json", "h200.txt", "step.png"}
    assert files["step.png"].image == "bench/step.png" and png_size((out / "bench/step.png").read_bytes()) == (5, 2)
    assert files["h200.txt"].text.startswith("tp  step_us")
    assert [t.title for t in files["h200.json"].tables] == ["environment", "rows"]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("missing.json", None, "no such file"),
        ("plot.svg", "<svg/>", "not a benchmark result (expected .json, .png or .txt)"),
        ("broken.json", "{", "not JSON"),
        ("fake.png", "text", "not a PNG image"),
    ],
)
def test_bad_bench_input_is_named(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(ReportError) as error:
        load_bench([str(path)], tmp_path / "site")
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)


def test_a_folder_without_results_is_an_error(tmp_path):
    with pytest.raises(ReportError, match="no benchmark results"):
        collect_bench_files([str(tmp_path)])
