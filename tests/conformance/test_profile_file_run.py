"""A profile of one's own through the command line: one file that changes one rule of vllm-0.33 (the
owner, by batch position), and the suite runs reference and production under it, judged by its rules."""

import json
import os
import pathlib

import pytest

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


def test_a_profile_file_edited_during_the_run_changes_nothing(tmp_path, monkeypatch, capsys):
    """The file is resolved once, before any case: the ranks (processes of their own) receive its rules with
    their jobs. Before, they read the file again, and an edit made after the judge had read it (here: the
    owner rule back to vllm-0.33's) made the innocent reference fail INV-OWNER."""
    import hashlib

    from shardspec.conformance import cli

    mine = tmp_path / "mine.yaml"
    mine.write_bytes(PROFILE_FILE.read_bytes())
    resolve = cli.resolved_run

    def resolve_then_edit(args, environ=None):
        resolved = resolve(args, environ)
        mine.write_text(mine.read_text().replace("position_mod_tp", "slot_mod_tp"))
        return resolved

    monkeypatch.setattr(cli, "resolved_run", resolve_then_edit)
    report = tmp_path / "report.json"
    args = ["--profile-file", str(mine), "--impl", "reference", "--tp", "2", "--fixtures-only", "--launcher", "fork"]
    assert main([*args, "--json", str(report), "--run-dir", str(tmp_path / "run")]) == 0
    data = json.loads(report.read_text())
    rows = {row["invariant"]: row["results"]["2"] for section in data["sections"] for row in section["table"]}
    assert rows["INV-OWNER"] == "pass" and "slot_mod_tp" in mine.read_text()
    digest = hashlib.sha256(PROFILE_FILE.read_bytes()).hexdigest()  # of the bytes judged under, not of the edit
    assert data["metadata"]["profile_file"] == {"path": str(mine), "sha256": digest}
    assert f"profile position-owner (file {mine}, sha256 {digest})" in capsys.readouterr().out


HEAD = "name: mine\nextends: vllm-0.34\n"
# Each a file a careless or hostile user passed; before, these hung, grew memory, printed a traceback, or
# were accepted (the duplicate key, the contradiction: then the reference crashed and the run said only
# that no case was judged).
BAD_FILES = {
    "misspelt-extends": ("name: mine\nextends: vllm-0.3\n", "extends unknown profile 'vllm-0.3'"),
    "list-value": (HEAD + "rules:\n  owner: [position_mod_tp]\n", "rule owner: unknown value ['position_mod_tp']"),
    "duplicate-rule": (HEAD + "rules:\n  owner: slot_mod_tp\n  owner: position_mod_tp\n", "duplicate key 'owner'"),
    "contradiction": (
        HEAD + "rules:\n  grammar_slicing: rows\n",
        "contradicts itself: rule admitted_drafts: admitted needs grammar_slicing: blocks, not rows",
    ),
    "bomb": (HEAD + "meaning: &a [x, x, x, x]\nupstream: [*a, *a, *a, *a]\n", "anchors and aliases are not allowed"),
    "huge": (HEAD + "#" * 70_000 + "\n", "over 64 KiB"),
    "fifo": (None, "not a regular file (a FIFO)"),
}


@pytest.mark.parametrize("kind", BAD_FILES)
def test_a_bad_profile_file_is_one_line_and_exit_2_by_flag_and_by_environment(kind, tmp_path, monkeypatch, capsys):
    text, message = BAD_FILES[kind]
    path = tmp_path / f"{kind}.yaml"
    if text is None:
        os.mkfifo(path)  # on main, reading it waited for a writer forever
    else:
        path.write_text(text)
    assert main(["--profile-file", str(path), "--fixtures-only"]) == 2
    by_flag = capsys.readouterr().err.strip()
    monkeypatch.setenv("SHARDSPEC_PROFILE_FILE", str(path))
    assert main(["--fixtures-only"]) == 2
    by_variable = capsys.readouterr().err.strip()
    for err, where in ((by_flag, "--profile-file"), (by_variable, "$SHARDSPEC_PROFILE_FILE")):
        assert len(err.splitlines()) == 1 and f"{where}: {path}: " in err and message in err, err
    assert by_flag.replace("--profile-file", "$SHARDSPEC_PROFILE_FILE") == by_variable
