"""The page of releases x invariants (report releases) built from the JSON reports of three real runs: the
reference under vllm-0.34; an engine that says it is release "engine 9.9" (errors that name no
precondition) under vllm-0.33, with one of its two failures known (an xfails file with a reason); and
production under vllm-0.34 at tp 1 alone, where that profile builds no sharder (PRE-TP-SIZE): it judges
that rejection and nothing else, so its other cells read "not run"."""

import json
import pathlib
import re

import pytest

from shardspec.conformance.cli import main as run_suite
from shardspec.conformance.report.html import main as report_main
from shardspec.conformance.report.model import load_report
from shardspec.conformance.report.releases import KNOWN, NOT_JUDGED, PASSED, UNTRIAGED, build_releases

DATA = pathlib.Path(__file__).parent / "data" / "releases"
REASON = "its errors name no precondition (known in this test)"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("releases")
    xfails = out / "known.yaml"
    xfails.write_text(f"INV-REJECT-NAMES-PRECONDITION: {REASON}\n")
    common = ["--tp", "2", "--fixtures-only", "--in-process", "--run-dir"]
    first, second = out / "reference-0.34.json", out / "engine-0.33.json"
    code = run_suite(["--impl", "reference", "--profile", "vllm-0.34", *common, str(out / "a"), "--json", str(first)])
    assert code == 0
    with pytest.MonkeyPatch.context() as patch:  # the probe's child process and the in-process ranks import it
        patch.syspath_prepend(str(DATA))
        patch.setenv("PYTHONPATH", str(DATA))
        engine = ["--impl", "released_engine:EngineNineNine", "--profile", "vllm-0.33", "--xfails-file", str(xfails)]
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
        ("reference", "vllm-0.34", (2,)),
        ("engine 9.9", "vllm-0.33", (2,)),
        ("production", "vllm-0.34", (1,)),
    ]
    assert page.cell("INV-OWNER", "reference").state == PASSED
    assert page.cell("INV-OWNER", "engine 9.9").state == PASSED
    known = page.cell("INV-REJECT-NAMES-PRECONDITION", "engine 9.9")
    assert (known.state, known.reasons) == (KNOWN, (REASON,))
    assert page.cell("INV-REJECT-INVALID", "engine 9.9").state == UNTRIAGED
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
    assert "engine 9.9" in html and "profile vllm-0.33" in html and "profile vllm-0.34" in html
    page = build_releases([load_report(path) for path in reports])
    rows = re.findall(r'<tr class="invariant" data-invariant="([^"]+)">(.*?)</tr>', html, re.S)
    assert [inv for inv, _ in rows] == [inv for inv, _ in page.rows]
    states = {inv: re.findall(r'data-state="([^"]+)"', cells) for inv, cells in rows}
    assert states["INV-REJECT-NAMES-PRECONDITION"] == [PASSED, KNOWN, NOT_JUDGED]
    assert states["INV-REJECT-INVALID"] == [PASSED, UNTRIAGED, PASSED]
    assert states["INV-OWNER"] == [PASSED, PASSED, NOT_JUDGED]
    assert REASON in dict(rows)["INV-REJECT-NAMES-PRECONDITION"]


def test_a_folder_or_a_report_that_is_not_one_is_refused_in_one_line(runs, capsys):
    out, first, *_ = runs
    assert report_main(["releases", str(first), "-o", str(out)]) == 2
    assert report_main(["releases", str(DATA / "released_engine.py"), "-o", str(out / "x.html")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(line.startswith("shardspec report releases: error:") for line in errors)
