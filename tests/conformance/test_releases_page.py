"""The page of releases x invariants (report releases) built from the JSON reports of three real runs: the
reference under vllm-0.34; an engine that says it is release "engine 9.9" (errors that name no
precondition) under vllm-0.33, with one of its two failures known (an xfails file with a reason); and
production under vllm-0.34 at tp 1 alone, where that profile builds no sharder (PRE-TP-SIZE): it judges
that rejection and nothing else, so its other cells read "not run"."""

import json
import os
import pathlib
import re
from types import SimpleNamespace

import pytest
from chromium_cdp import headless_chromium
from png import png_size

from shardspec.conformance.cli import main as run_suite
from shardspec.conformance.report.html import main as report_main
from shardspec.conformance.report.model import SPEC_CHOICE, load_report
from shardspec.conformance.report.releases import DEFECT, KNOWN, NOT_JUDGED, PASSED, UNTRIAGED, build_releases
from shardspec.conformance.report.summary import Section, untriaged_counts
from shardspec.conformance.report.xfails import Xfails
from shardspec.spec.loader import load_spec

DATA = pathlib.Path(__file__).parent / "data" / "releases"
REASON = "its errors name no precondition (known in this test)"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("releases")
    xfails = out / "known.yaml"
    xfails.write_text(f"INV-REJECT-NAMES-PRECONDITION: {REASON}\n")
    common = ["--tp", "2", "--fixtures-only", "--in-process", "--run-dir"]
    first, second = out / "reference-0.34.json", out / "engine-0.33.json"
    strict = ["--impl", "reference", "--profile", "vllm-0.34-strict"]  # its must-reject fixtures are judged
    code = run_suite([*strict, *common, str(out / "a"), "--json", str(first)])
    assert code == 0
    with pytest.MonkeyPatch.context() as patch:  # the probe's child process and the in-process ranks import it
        patch.syspath_prepend(str(DATA))
        patch.setenv("PYTHONPATH", str(DATA))
        enforced = str(DATA / "vllm-0.33-enforced.yaml")  # must-reject cases are outside vllm-0.33's contract
        engine = ["--impl", "released_engine:EngineNineNine", "--profile-file", enforced, "--xfails-file", str(xfails)]
        assert run_suite([*engine, *common, str(out / "b"), "--json", str(second)]) == 1  # INV-REJECT-INVALID
    third = out / "production-0.34-tp1.json"
    one = ["--impl", "production", "--profile", "vllm-0.34", "--tp", "1", "--fixtures-only", "--in-process"]
    assert run_suite([*one, "--run-dir", str(out / "c"), "--json", str(third)]) == 0
    return out, first, second, third


def test_each_release_is_a_column_of_pass_known_untriaged_and_not_run(runs):
    _, first, second, third = runs
    assert json.loads(second.read_text())["metadata"]["releases"] == {"released_engine:EngineNineNine": "engine 9.9"}
    page = build_releases([load_report(path) for path in (first, second, third)])
    titles = [(c.title, c.profile, c.tp_sizes) for c in page.columns]
    assert titles == [
        ("reference", "vllm-0.34-strict", (2,)),
        ("engine 9.9", "vllm-0.33-enforced", (2,)),
        ("production", "vllm-0.34", (1,)),
    ]
    assert page.cell("INV-OWNER", "reference").state == PASSED
    assert page.cell("INV-OWNER", "engine 9.9").state == PASSED
    known = page.cell("INV-REJECT-NAMES-PRECONDITION", "engine 9.9")
    assert (known.state, known.reasons) == (KNOWN, (REASON,))
    untriaged = page.cell("INV-REJECT-INVALID", "engine 9.9")
    assert untriaged.state == UNTRIAGED
    # The run's JSON counts the failing cases no known failure covers; the cell reads that number.
    row = next(
        r for r in json.loads(second.read_text())["sections"][0]["table"] if r["invariant"] == "INV-REJECT-INVALID"
    )
    assert untriaged.count == row["untriaged"]["2"] > 0 and untriaged.text == f"{untriaged.count} untriaged"
    assert page.cell("INV-REJECT-INVALID", "reference").state == PASSED
    # At tp 1 vllm-0.34 judges the PRE-TP-SIZE rejection only, and the run says so.
    notes = json.loads(third.read_text())["metadata"]["notes"]
    assert any("only that rejection is judged" in note and "PRE-TP-SIZE" in note for note in notes), notes
    assert page.cell("INV-REJECT-INVALID", "production").state == PASSED
    assert page.cell("INV-OWNER", "production").state == NOT_JUDGED
    assert page.cell("INV-OWNER", "production").detail == "tp 1: n/a"


def test_the_command_writes_the_page_with_every_row_and_column(runs):
    out, *reports = runs
    html_path = out / "releases.html"
    assert report_main(["releases", *map(str, reports), "-o", str(html_path)]) == 0
    html = html_path.read_text()
    assert "engine 9.9" in html and "profile vllm-0.33-enforced" in html and "profile vllm-0.34" in html
    page = build_releases([load_report(path) for path in reports])
    rows = re.findall(r'<tr class="invariant" data-invariant="([^"]+)">(.*?)</tr>', html, re.S)
    assert [inv for inv, _ in rows] == [inv for inv, _ in page.rows]
    states = {inv: re.findall(r'data-state="([^"]+)"', cells) for inv, cells in rows}
    assert states["INV-REJECT-NAMES-PRECONDITION"] == [PASSED, KNOWN, NOT_JUDGED]
    assert states["INV-REJECT-INVALID"] == [PASSED, UNTRIAGED, PASSED]
    assert states["INV-OWNER"] == [PASSED, PASSED, NOT_JUDGED]
    known = dict(rows)["INV-REJECT-NAMES-PRECONDITION"]
    assert re.search(r'data-state="known"[^>]*>\d+ known <span class="key">K1</span>', known), known
    assert f"<dd>{REASON}</dd>" in html  # the reason is printed once, under the table (and in the cell's title)


def test_a_folder_or_a_report_that_is_not_one_is_refused_in_one_line(runs, capsys):
    out, first, *_ = runs
    assert report_main(["releases", str(first), "-o", str(out)]) == 2
    assert report_main(["releases", str(DATA / "released_engine.py"), "-o", str(out / "x.html")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(line.startswith("shardspec report releases: error:") for line in errors)


# -- four releases, from synthetic JSON reports (no run), in headless Chromium at 1280 px ---------------------

WIDTH, HEIGHT = 1280, 900
RELEASES = ("engine 1.0", "engine 2.0", "engine 3.0", "engine 4.0")
# Reasons as long as a real known-failures file's: the page must not print them in its cells.
DEFECT_EMPTY = (
    "vllm-defect: For an empty batch the plan kernel is not launched, so the one entry of the local "
    "cu_num_logits (new_empty(1)) is never written (row 0 held e.g. 819702191 where the spec asks for 0)."
)
DEFECT_LOGPROBS = (
    "vllm-defect: The logprob send buffers are torch.empty and the pack kernel runs only when the rank's "
    "local output has logprobs_tensors; a rank whose sampler returned none sends uninitialised rows."
)
CHOICE_STRIDED = (
    "spec-choice: The plan kernel reads idx_mapping, cu_num_logits, query_start_loc and seq_lens as contiguous "
    "arrays through their data pointers; the engine's input batch only ever builds contiguous tensors."
)
CHOICE_EXTENSIONS = (
    "spec-choice: gather_sampler_output has no parameter for extension fields and returns a SamplerOutput "
    "without them; the engine's config refuses batch-sharded sampling together with return_sampling_mask."
)
NO_WHY = "the errors name no precondition (an entry keyed by invariant, with no why)"
# Per release: invariant -> (state, failing cases at tp 2, the known failures' reasons); the rest pass.
PLANS = [
    {
        "INV-LOCAL-CU-NUM-LOGITS": (KNOWN, 1, (DEFECT_EMPTY,)),
        "INV-LOGPROBS-MISSING": (KNOWN, 4, (DEFECT_LOGPROBS,)),
        "INV-WIRE-LOGPROBS": (KNOWN, 4, (DEFECT_LOGPROBS, CHOICE_STRIDED)),
        "INV-OWNER": (KNOWN, 6, (CHOICE_STRIDED,)),
        "INV-GATHER-EXTENSIONS": (KNOWN, 3, (CHOICE_EXTENSIONS,)),
        "INV-REJECT-NAMES-PRECONDITION": (KNOWN, 12, (NO_WHY,)),
    },
    {
        "INV-LOCAL-CU-NUM-LOGITS": (KNOWN, 1, (DEFECT_EMPTY,)),
        "INV-OWNER": (KNOWN, 6, (CHOICE_STRIDED,)),
        "INV-GATHER-EXTENSIONS": (UNTRIAGED, 2, ()),
        "INV-E2E-TRANSPARENCY": (UNTRIAGED, 11, ()),
    },
    {"INV-OWNER": (KNOWN, 6, (CHOICE_STRIDED,)), "INV-LOCAL-SEQ-LENS-UPPER-BOUND": (NOT_JUDGED, 0, ())},
    {"INV-LOCAL-SEQ-LENS-UPPER-BOUND": (NOT_JUDGED, 0, ())},
]
VERDICT = {PASSED: "pass", KNOWN: "xfail", UNTRIAGED: "FAIL", NOT_JUDGED: "n/a"}


def synthetic_report(path: pathlib.Path, release: str, plan: dict, invariants: list[str]) -> pathlib.Path:
    """A JSON report as a run writes it: one entry at tp 2 and 3, failing cases at tp 2 only."""
    implementation = f"engine_{release.split()[1]}:make_sharder"
    table, cases = [], []
    for invariant in invariants:
        state, failing, reasons = plan.get(invariant, (PASSED, 0, ()))
        at_2 = VERDICT[state]
        row = {"invariant": invariant, "level": "MUST", "results": {"2": at_2, "3": "pass" if at_2 != "n/a" else at_2}}
        row.update({"known": {"2": list(reasons)}} if reasons else {})
        row.update({"untriaged": {"2": failing}} if state == UNTRIAGED else {})
        table.append(row)
        violation = {"invariant_id": invariant, "rank": 0, "message": "synthetic"}
        cases += [
            {"case_id": f"{invariant}-{i}", "tp": 2, "status": "fail", "violations": [violation]}
            for i in range(failing)
        ]
    for name in ("(run errors)", "(cases not run)"):
        table.append({"invariant": name, "level": "MUST", "results": {"2": "pass", "3": "pass"}})
    section = {"implementation": implementation, "tp_sizes": [2, 3], "table": table, "cases": cases}
    metadata = {"profile": "vllm-0.34", "shardspec": "0.9.0", "releases": {implementation: release}}
    path.write_text(json.dumps({"metadata": metadata, "exit_code": 1, "sections": [section]}))
    return path


@pytest.fixture(scope="module")
def four_releases(tmp_path_factory):
    out = tmp_path_factory.mktemp("four")
    invariants = [inv.id for inv in load_spec(profile="vllm-0.34").invariants if not inv.retired]
    reports = [
        synthetic_report(out / f"release-{i}.json", release, plan, invariants)
        for i, (release, plan) in enumerate(zip(RELEASES, PLANS, strict=True))
    ]
    assert report_main(["releases", *map(str, reports), "-o", str(out / "releases.html")]) == 0
    return reports, out / "releases.html"


def test_cells_count_cases_and_key_their_reasons_by_kind(four_releases):
    reports, _ = four_releases
    page = build_releases([load_report(path) for path in reports])
    assert [c.title for c in page.columns] == list(RELEASES)
    both = page.cell("INV-WIRE-LOGPROBS", "engine 1.0")
    assert (both.text, both.kind, page.keys(both)) == ("4 known", DEFECT, ["D2", "S1"])
    choice = page.cell("INV-OWNER", "engine 3.0")
    assert (choice.text, choice.kind, page.keys(choice)) == ("6 known", SPEC_CHOICE, ["S1"])
    unsaid = page.cell("INV-REJECT-NAMES-PRECONDITION", "engine 1.0")
    assert (unsaid.text, unsaid.kind, page.keys(unsaid)) == ("12 known", "", ["K1"])
    assert page.cell("INV-E2E-TRANSPARENCY", "engine 2.0").text == "11 untriaged"
    assert page.cell("INV-OWNER", "engine 4.0").text == PASSED
    assert page.cell("INV-LOCAL-SEQ-LENS-UPPER-BOUND", "engine 4.0").text == NOT_JUDGED
    assert {r.key: r.cells for r in page.reasons.values()} == {"D1": 2, "D2": 2, "S1": 4, "S2": 1, "K1": 1}
    assert page.reasons[CHOICE_STRIDED].text == CHOICE_STRIDED.removeprefix("spec-choice: ")
    assert page.tally(1) == [(PASSED, len(page.rows) - 4), ("known D", 1), ("known S", 1), (UNTRIAGED, 2)]


def test_an_untriaged_cell_counts_only_the_cases_no_known_failure_covers():
    failing = [
        SimpleNamespace(case_id=f"c{i}", tp=2, status="fail", violations=[{"invariant_id": "INV-OWNER"}])
        for i in range(3)
    ]
    section = Section("impl", failing, [2])
    rows = [["INV-OWNER", "MUST", "FAIL"], ["INV-SPLITS", "MUST", "pass"]]
    assert untriaged_counts(section, rows, Xfails({"c0": "known"})) == {"INV-OWNER": {"2": 2}}


@pytest.fixture(scope="module")
def browser():
    with headless_chromium(WIDTH, HEIGHT, "the page of releases was not opened at 1280 px") as chromium:
        yield chromium


@pytest.mark.browser
def test_four_releases_fit_1280_px_in_compact_cells(four_releases, browser, tmp_path):
    _, html_path = four_releases
    browser.open(html_path.as_uri())
    assert browser.evaluate("window.innerWidth") == WIDTH
    # Nothing scrolls sideways: the page, the table's wrapper, and every release column end in the viewport.
    assert browser.evaluate("document.documentElement.scrollWidth") <= WIDTH
    assert browser.evaluate("(w => w.scrollWidth <= w.clientWidth)(document.querySelector('.matrix-wrap'))")
    heads = browser.evaluate(
        "Array.from(document.querySelectorAll('th.release')).map(th => "
        "{ const r = th.getBoundingClientRect(); return [th.innerText.split('\\n')[0], r.left, r.right]; })"
    )
    assert [title for title, _, _ in heads] == list(RELEASES)
    assert all(0 <= left and right <= WIDTH for _, left, right in heads), heads
    # ... and nothing in a header or a cell is cut off: what each holds fits its box.
    clipped = "Array.from(document.querySelectorAll('#releases th, #releases td')).filter(e => "
    clipped += "e.scrollWidth > e.clientWidth).map(e => e.innerText)"
    assert browser.evaluate(clipped) == []
    # Compact cells: a few words on one line, never a reason; the reasons are in titles and the legend.
    cells = browser.evaluate(
        "Array.from(document.querySelectorAll('#releases td.cell')).map(td => "
        "[td.innerText.trim(), td.getBoundingClientRect().height, parseFloat(getComputedStyle(td).lineHeight), "
        "td.title])"
    )
    assert len(cells) == 4 * browser.evaluate("document.querySelectorAll('#releases tr.invariant').length")
    assert all(len(text) <= 20 and height < 2 * line for text, height, line, _ in cells), max(cells, key=lambda c: c[1])
    legend = browser.evaluate("document.querySelector('dl.reasons').innerText")
    for reason in (DEFECT_EMPTY, DEFECT_LOGPROBS, CHOICE_STRIDED, CHOICE_EXTENSIONS, NO_WHY):
        text = reason.split(": ", 1)[1] if reason != NO_WHY else reason
        assert text in legend and not any(text in cell for cell, *_ in cells)
        assert any(text in title for *_, title in cells)
    # Defects, spec choices, no why and untriaged differ in colour, and in text (D1, S1, K1, "untriaged").
    look = "(td => [getComputedStyle(td).backgroundColor, td.innerText.trim()])(document.querySelector({!r}))"
    shown = {
        name: tuple(browser.evaluate(look.format(f'tr[data-invariant="{inv}"] td:nth-child({column + 2})')))
        for name, inv, column in (
            ("defect", "INV-LOCAL-CU-NUM-LOGITS", 0),
            ("choice", "INV-OWNER", 2),
            ("no why", "INV-REJECT-NAMES-PRECONDITION", 0),
            ("untriaged", "INV-E2E-TRANSPARENCY", 1),
            ("pass", "INV-OWNER", 3),
        )
    }
    assert len({background for background, _ in shown.values()}) == len(shown), shown
    assert [text for _, text in shown.values()] == ["1 known D1", "6 known S1", "12 known K1", "11 untriaged", "pass"]

    screenshot = browser.screenshot(full_page=True)
    assert png_size(screenshot)[0] == WIDTH
    folder = pathlib.Path(
        os.environ.get("SHARDSPEC_SCREENSHOTS") or tmp_path
    )  # SHARDSPEC_SCREENSHOTS=docs: the README's
    (folder / "releases-page.png").write_bytes(screenshot)
