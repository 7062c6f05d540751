"""The report names the spec version it checks, and warns when an implementation targets another."""

import json

from shardspec.conformance.cli import main
from shardspec.spec.loader import spec_version


def test_a_declared_older_spec_version_is_a_warning(tmp_path, plugins_on_path, capsys):
    report = tmp_path / "r.json"
    assert (
        main(
            ["--in-process", "--impl", "old_spec_sharder:TargetsSpec01", "--case", "tp2-decode", "--json", str(report)]
        )
        == 0
    )
    data = json.loads(report.read_text())
    assert data["metadata"]["spec_version"] == spec_version()
    assert any(f"targets spec 0.1.0, the suite checks spec {spec_version()}" in w for w in data["warnings"])
    assert f"shardspec conformance against spec {spec_version()}" in capsys.readouterr().out
