"""The HTML report, built from recorded runs and opened in headless Chromium.

The browser tests need Debian's ``chromium`` (``.ci/run`` installs it where it can; or point
SHARDSPEC_CHROMIUM at another Chromium). Without it they are skipped, and pytest's summary
(``-ra``) says why.
"""

import json
import pathlib
import sys

import pytest
from chromium_cdp import headless_chromium
from png import png_size, tiny_png

from shardspec.conformance.report.html import main
from shardspec.conformance.report.matrix import RUN_ROWS
from shardspec.spec.loader import load_spec

DATA = pathlib.Path(__file__).parent / "data"
RUNS = [DATA / "run-v1.json", DATA / "run-v2.json"]
WIDTH, HEIGHT = 1600, 1000


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    bench = tmp_path_factory.mktemp("bench")
    (bench / "step.png").write_bytes(tiny_png(40, 20))
    (bench / "h200.json").write_text(json.dumps({"rows": [{"tp": 8, "production.step": {"wall_us": 167.0}}]}))
    assert main(["--bench", str(bench), *map(str, RUNS), "-o", str(out)]) == 0  # as `nox -s report` orders them
    return out


@pytest.fixture(scope="module")
def browser():
    with headless_chromium(WIDTH, HEIGHT, "the HTML report's browser tests did not run") as chromium:
        yield chromium


def expected_shape():
    """Rows: the spec's invariants, any the runs checked beyond them, the run rows; columns: every
    (run, entry, tp) of the recorded JSON."""
    reports = [json.loads(path.read_text()) for path in RUNS]
    # The rows are those of the profile the first report was judged under (before spec 0.4: vllm-seed).
    profile = reports[0]["metadata"].get("profile") or "vllm-seed"
    spec_ids = {inv.id for inv in load_spec(profile=profile).invariants if not inv.retired}
    checked = {row["invariant"] for r in reports for s in r["sections"] for row in s["table"]}
    rows = len(spec_ids | (checked - set(RUN_ROWS))) + len(RUN_ROWS)
    columns = sum(len(s["tp_sizes"]) for r in reports for s in r["sections"])
    return rows, columns


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    not_json, not_report = tmp_path / "a.json", tmp_path / "b.json"
    not_json.write_text("{")
    not_report.write_text('{"results": []}')
    for path, problem in (
        (tmp_path / "missing.json", "no such file"),
        (not_json, "not JSON"),
        (not_report, "not a conformance report"),
    ):
        assert main([str(RUNS[0]), str(path), "-o", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(path) in err and problem in err
    assert not (tmp_path / "out" / "index.html").exists()
    (tmp_path / "a-file").write_text("")
    assert main([str(RUNS[0]), "-o", str(tmp_path / "a-file")]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err


def test_without_jinja2_the_error_says_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "jinja2", None)  # import jinja2 raises ModuleNotFoundError
    assert main([str(RUNS[0]), "-o", str(tmp_path / "out")]) == 2
    assert "pip install 'shardspec[report]'" in capsys.readouterr().err


def test_the_folder_needs_nothing_from_the_network(site):
    assert sorted(p.name for p in site.iterdir()) == ["bench", "bench.html", "diff.html", "index.html"]
    for page in site.glob("*.html"):
        html = page.read_text()
        assert "http://" not in html and "https://" not in html, page.name
        assert "<link" not in html and "<script src" not in html, page.name


@pytest.mark.browser
def test_the_matrix_renders_and_a_failing_cell_opens_its_detail(site, browser, tmp_path):
    browser.open((site / "index.html").as_uri())
    rows, columns = expected_shape()
    assert browser.evaluate("document.querySelectorAll('#matrix tr.invariant').length") == rows
    assert browser.evaluate("document.querySelectorAll('#matrix td.cell').length") == rows * columns
    assert (
        browser.evaluate("document.querySelector('#matrix tr.invariant').querySelectorAll('td.cell').length") == columns
    )
    # Every resource the page loaded came from the folder itself.
    schemes = browser.evaluate("performance.getEntriesByType('resource').map(e => e.name.split(':')[0])")
    assert set(schemes) <= {"file"}

    cell = 'tr[data-invariant="INV-OWNER"] td[data-column="run-v2|regression_adapter:make_sharder|2"]'
    assert browser.evaluate(f"document.querySelector('{cell}').dataset.verdict") == "fail"
    detail = browser.evaluate(f"document.querySelector('{cell} a').getAttribute('href')")
    shown = f"getComputedStyle(document.querySelector('{detail}')).display"
    assert browser.evaluate(shown) == "none"
    browser.click(f"{cell} a")
    assert browser.wait_for(shown, "block") == "block"
    text = browser.evaluate(f"document.querySelector('{detail}').innerText")
    assert "tp2-decode" in text and "is owned by rank" in text
    assert "reproduce: python -m shardspec.conformance --impl regression_adapter:make_sharder --case tp2-decode" in text
    assert browser.wait_for(f"document.querySelector('{cell}').classList.contains('selected')", True)

    screenshot = browser.screenshot()
    (tmp_path / "matrix.png").write_bytes(screenshot)
    assert png_size(screenshot) == (WIDTH, HEIGHT)


@pytest.mark.browser
def test_the_diff_page_shows_the_regression(site, browser):
    browser.open((site / "diff.html").as_uri())
    section = '.diff[data-implementation="regression_adapter:make_sharder"]'
    rows = f"""document.querySelectorAll('{section} table[data-kind="newly failing"] tr')"""
    failing = browser.evaluate(f"Array.from({rows}).slice(1).map(tr => Array.from(tr.cells).map(td => td.innerText))")
    assert ["INV-OWNER", "2", "pass", "fail", "tp2-decode"] in failing
    judged = browser.evaluate(f"document.querySelector('{section} .count[data-kind=\"newly judged\"]').innerText")
    assert judged.startswith("newly judged: ") and int(judged.split(": ")[1]) > 0
    unchanged = '.diff[data-implementation="reference/production"] .count[data-kind="newly failing"]'
    assert browser.evaluate(f"document.querySelector('{unchanged}').innerText") == "newly failing: 0"


@pytest.mark.browser
def test_the_bench_page_shows_the_plot_and_the_table(site, browser):
    browser.open((site / "bench.html").as_uri())
    assert browser.evaluate("document.querySelector('img.plot').naturalWidth") == 40
    cells = browser.evaluate("Array.from(document.querySelectorAll('table.bench td')).map(td => td.innerText)")
    assert cells == ["8", "production.step", "167"]
