"""An xfails entry limited to input layouts covers failures on those inputs only (only_with_layouts)."""

from types import SimpleNamespace

import pytest

from shardspec.conformance.report.xfails import load_xfails


def _result(case_id, layouts):
    return SimpleNamespace(case_id=case_id, case=SimpleNamespace(layouts=layouts))


def test_a_scoped_entry_covers_strided_cases_only(tmp_path):
    path = tmp_path / "xfails.yaml"
    path.write_text(
        "INV-OWNER: {kind: spec-choice, why: strided views read as contiguous, only_with_layouts: [strided]}\n"
        "INV-GATHER-NANS: {kind: upstream-defect, why: every case}\n"
    )
    xfails = load_xfails(str(path))
    assert xfails.covers("INV-OWNER", _result("a", {"seq_lens": "strided", "idx_mapping": "offset"}))
    assert not xfails.covers("INV-OWNER", _result("b", {"seq_lens": "offset"}))  # a regression still fails
    assert not xfails.covers("INV-OWNER", _result("c", {}))
    assert xfails.covers("INV-GATHER-NANS", _result("c", {}))
    assert xfails.entries["INV-OWNER"] == "strided views read as contiguous"


def test_a_malformed_scope_is_refused(tmp_path):
    path = tmp_path / "xfails.yaml"
    path.write_text("INV-OWNER: {why: x, only_with_layouts: strided}\n")
    with pytest.raises(ValueError, match="only_with_layouts"):
        load_xfails(str(path))
