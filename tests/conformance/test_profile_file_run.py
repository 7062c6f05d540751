"""A profile of one's own through the command line: one file that changes one rule of vllm-0.33 (the
owner, by batch position), and the suite runs reference and production under it, judged by its rules."""

import json
import pathlib

from shardspec.conformance.cli import main

PROFILE_FILE = pathlib.Path(__file__).parent / "data" / "profiles" / "position-owner.yaml"


def test_reference_and_production_pass_under_a_profile_file(tmp_path):
    report = tmp_path / "report.json"
    args = ["--profile-file", str(PROFILE_FILE), "--impl", "reference,production", "--tp", "2", "--fixtures-only"]
    assert main([*args, "--in-process", "--json", str(report), "--run-dir", str(tmp_path / "run")]) == 0
    data = json.loads(report.read_text())
    assert data["exit_code"] == 0 and data["metadata"]["profile"] == "position-owner"
    rows = {row["invariant"]: row["results"]["2"] for section in data["sections"] for row in section["table"]}
    assert rows["INV-OWNER"] == "pass"
