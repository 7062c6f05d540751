"""An implementation may decline extension fields with PRE-EXTENSION-SUPPORTED: a verdict, not a run error."""

import json

from shardspec.conformance.cli import main


def _table(tmp_path, impl):
    report = tmp_path / "r.json"
    code = main(
        # Under the profile whose callers declare extension fields (vLLM 0.34's refuses them).
        ["--in-process", "--impl", impl, "--profile", "vllm-0.34-strict", "--case", "tp2-extensions"]
        + ["--case", "tp2-decode", "--json", str(report)]
    )
    rows = json.loads(report.read_text())["sections"][0]["table"]
    return code, {row["invariant"]: row["results"]["2"] for row in rows}


def test_declining_extension_fields_is_judged_and_passes(tmp_path, plugins_on_path):
    code, table = _table(tmp_path, "declining_sharder:DeclinesExtensions")
    assert (code, table["INV-GATHER-EXTENSIONS"], table["(run errors)"]) == (0, "pass", "pass")


def test_dropping_extension_fields_fails_the_extension_invariant(tmp_path):
    code, table = _table(tmp_path, "shardspec.conformance.broken.extensions:DropsExtensionField")
    assert (code, table["INV-GATHER-EXTENSIONS"]) == (1, "FAIL")
