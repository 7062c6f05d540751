"""SPEC.md is rendered deterministically and kept up to date."""

import re

import pytest

from shardspec.spec import render
from shardspec.spec.loader import load_spec
from shardspec.spec.markdown import anchor


@pytest.fixture(scope="module")
def spec():
    return load_spec()


@pytest.fixture(scope="module")
def text(spec):
    return render.render(spec)


def test_rendering_is_deterministic(spec, text):
    assert render.render(load_spec()) == text


def test_shipped_spec_md_is_up_to_date(text):
    fresh, diff = render.check(text, render.DEFAULT_OUTPUT)
    assert fresh, "spec/SPEC.md is stale; run `python -m shardspec.spec.render`\n" + diff[:4000]


def test_check_reports_a_stale_file_with_a_unified_diff(tmp_path, text):
    stale = tmp_path / "SPEC.md"
    stale.write_text(text.replace("MUST", "MAY", 1))
    fresh, diff = render.check(text, stale)
    assert not fresh
    assert diff.startswith("---") and "-" in diff and "+" in diff and "MAY" in diff


def test_cli_writes_then_check_passes_then_fails_when_edited(tmp_path, capsys):
    output = tmp_path / "SPEC.md"
    assert render.main(["--output", str(output)]) == 0
    assert render.main(["--check", "--output", str(output)]) == 0
    output.write_text(output.read_text() + "hand edit\n")
    assert render.main(["--check", "--output", str(output)]) == 1
    assert "hand edit" in capsys.readouterr().out


def test_check_of_a_missing_file_fails(tmp_path, text):
    fresh, diff = render.check(text, tmp_path / "absent.md")
    assert not fresh and diff


def test_every_id_has_an_anchor_and_every_link_resolves(spec, text):
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', text))
    assert {anchor(i) for i in spec.ids} <= anchors
    links = set(re.findall(r"\]\(#([^)]+)\)", text))
    assert links <= anchors, links - anchors


def test_document_has_every_part(spec, text):
    for heading in (
        "## 1. Overview",
        "## 2. Data model",
        "## 3. Preconditions",
        "## 4. Invariants",
        "## 5. Clarifications",
        "## 6. Index of identifiers",
        "### Worked example",
    ):
        assert heading in text
    for inv in spec.invariants:
        assert inv.rationale.split()[0] in text
    for output in spec.data_model.outputs:
        assert f"`{output.name}`" in text
