"""``python -m shardspec.conformance upstream PATH``: vLLM's batch_shard.py against the spec's fields.

Run against vLLM 0.33.0's files (a tree, a wheel built here from them, an "installed" copy) and the
seed file the spec was first written from; edited copies show each kind of finding, and every bad
input exits 2 with one line. SHARDSPEC_VLLM_TREE / SHARDSPEC_SEED_FILE point elsewhere.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from shardspec.conformance.upstream import drift
from shardspec.conformance.upstream.command import main as upstream_main
from shardspec.conformance.upstream.source import SHARD_FILE
from shardspec.spec.profiles import PROFILES

VLLM_TREE = Path(os.environ.get("SHARDSPEC_VLLM_TREE", "/work/shared/upstream/vllm-0.33.0"))
SEED_FILE = Path(os.environ.get("SHARDSPEC_SEED_FILE", "/work/shared/seed/batch_shard.py"))
pytestmark = pytest.mark.skipif(
    not (VLLM_TREE / SHARD_FILE).is_file() or not SEED_FILE.is_file(),
    reason=f"vLLM 0.33.0's files ({VLLM_TREE}) or the seed file ({SEED_FILE}) are not here",
)
# What vLLM 0.33 touches and the seed revision does not (the profile vllm-0.33 alone has them).
NEW_IN_0_33 = {
    ("InputBatch", "seq_lens_cpu_upper_bound"),
    ("InputBatch", "num_admitted_draft_tokens"),
    ("GrammarOutput", "num_acceptable_drafts"),
    ("LogprobsTensors", "cu_num_generated_tokens_tensor"),
    ("BatchShardMetadata", "adaptive_verification_enabled"),
}
METADATA = "Metadata-Version: 2.1\nName: vllm\nVersion: {}\n"


def run(capsys, *args):
    code = upstream_main([*map(str, args), "--json"])
    captured = capsys.readouterr()
    assert captured.err == ""
    return code, json.loads(captured.out)


def found(report, kind):
    return {(f["type"], f["field"]) for f in report["findings"] if f["kind"] == kind}


def copy_tree(tmp_path, edit=None):
    """A copy of the 0.33 tree whose batch_shard.py is ``edit(text)``."""
    root = tmp_path / "tree"
    shutil.copytree(VLLM_TREE / "vllm", root / "vllm")
    file = root / SHARD_FILE
    file.chmod(0o644)
    if edit:
        file.write_text(edit(file.read_text()))
    return root


def build_wheel(tmp_path, version="0.33.0", name="vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"):
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as wheel:
        for file in sorted((VLLM_TREE / "vllm").rglob("*.py")):
            wheel.write(file, file.relative_to(VLLM_TREE).as_posix())
        wheel.writestr(f"vllm-{version}.dist-info/METADATA", METADATA.format(version))
    return path


def line_of(text, needle):
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize("profile", [None, "vllm-0.33"])
def test_the_0_33_tree_is_clean(capsys, profile):
    code, report = run(capsys, VLLM_TREE, *(["--profile", profile] if profile else []))
    assert (code, report["findings"]) == (0, [])
    assert report["profiles"] == ([profile] if profile else list(PROFILES))
    # The spec's extension fields are shardspec's own: listed with the reason, not a finding.
    assert [(s["type"], s["field"]) for s in report["shardspec_only"]] == [("SamplerOutput", "extensions")]
    assert all(reason for reason in drift.SHARDSPEC_ONLY.values())


def test_the_0_33_tree_against_the_seed_profile_touches_its_new_fields(capsys):
    code, report = run(capsys, VLLM_TREE, "--profile", "vllm-seed")
    assert code == 1
    assert found(report, "not_in_spec") == NEW_IN_0_33 and found(report, "not_touched") == set()


@pytest.mark.parametrize("profile", [None, "vllm-0.33"])
def test_the_seed_file_no_longer_touches_the_0_33_fields(capsys, profile):
    code, report = run(capsys, SEED_FILE, *(["--profile", profile] if profile else []))
    assert code == 1
    assert found(report, "not_touched") == NEW_IN_0_33 and found(report, "not_in_spec") == set()
    by_field = {f["field"]: f for f in report["findings"]}
    assert by_field["cu_num_generated_tokens_tensor"]["spec_types"] == [
        "LocalLogprobsTensors",
        "GatheredLogprobsTensors",
    ]
    with_bound = ["vllm-0.33", "vllm-0.34", "vllm-0.34-sharded-draft-cache", "vllm-0.34-strict"]
    assert sorted(by_field["seq_lens_cpu_upper_bound"]["profiles"]) == with_bound


def test_the_seed_file_is_clean_against_its_own_profile(capsys):
    assert run(capsys, SEED_FILE, "--profile", "vllm-seed")[0] == 0


def test_the_list_names_field_type_and_lines(capsys):
    assert upstream_main([str(VLLM_TREE), "--profile", "vllm-seed"]) == 1
    out = capsys.readouterr().out.splitlines()
    text = (VLLM_TREE / SHARD_FILE).read_text()
    read = line_of(text, "= input_batch.seq_lens_cpu_upper_bound[")
    given = line_of(text, "seq_lens_cpu_upper_bound=local_seq_lens_cpu_upper_bound")
    assert f"  seq_lens_cpu_upper_bound  InputBatch  line {read} (read), {given} (replace)" in out
    assert "touched by the code, not in the spec (5):" in out and out[-1].startswith("5 finding(s)")


def test_a_wheel_is_read_from_the_zip_with_its_version(capsys, tmp_path):
    code, report = run(capsys, build_wheel(tmp_path))
    assert (code, report["findings"], report["vllm_version"]) == (0, [], "0.33.0")
    assert report["source"].endswith(".whl!" + SHARD_FILE)
    assert report["touched"] == run(capsys, VLLM_TREE)[1]["touched"]


def test_a_version_without_a_profile_can_still_be_compared_against_one(capsys, tmp_path):
    wheel = build_wheel(tmp_path, "0.99.0", "vllm-0.99.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    assert upstream_main([str(wheel)]) == 2
    assert "vLLM 0.99.0 has no profile" in capsys.readouterr().err
    assert run(capsys, wheel, "--profile", "vllm-0.33")[0] == 0


def test_installed_finds_the_package_without_importing_it(capsys, tmp_path, monkeypatch):
    site = tmp_path / "site"
    shutil.copytree(VLLM_TREE / "vllm", site / "vllm")
    (site / "vllm" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (site / "vllm" / "_version.py").write_text("__version__ = version = '0.33.0'\n")
    monkeypatch.syspath_prepend(str(site))
    code, report = run(capsys, "installed")
    assert (code, report["vllm_version"]) == (0, "0.33.0") and "vllm" not in sys.modules
    assert report["source"] == str(site / SHARD_FILE)


@pytest.mark.parametrize(
    "edit, field, how",
    [
        (
            lambda t: t.replace("        tp_rank = self.tp_rank\n", "        tp_rank = input_batch.new_field\n"),
            ("InputBatch", "new_field"),
            "read",
        ),
        (
            lambda t: t.replace(
                "        logprob_token_ids=logprob_token_ids,\n",
                "        logprob_token_ids=logprob_token_ids,\n        new_field=None,\n",
            ),
            ("LogprobsTensors", "new_field"),
            "constructor",
        ),
        (
            lambda t: t.replace(
                "    adaptive_verification_enabled: bool\n",
                "    adaptive_verification_enabled: bool\n    new_field: int = 0\n",
            ),
            ("BatchShardMetadata", "new_field"),
            "class body",
        ),
    ],
)
def test_a_field_the_spec_lacks_is_a_finding(capsys, tmp_path, edit, field, how):
    root = copy_tree(tmp_path, edit)
    code, report = run(capsys, root)
    assert code == 1 and found(report, "not_in_spec") == {field} and found(report, "not_touched") == set()
    [(line, seen)] = report["findings"][0]["where"]
    assert seen == how and "new_field" in (root / SHARD_FILE).read_text().splitlines()[line - 1]


def test_a_spec_field_the_code_dropped_is_a_finding(capsys, tmp_path):
    root = copy_tree(tmp_path, lambda t: t.replace("input_batch.query_start_loc,", "None,"))
    code, report = run(capsys, root)
    assert code == 1 and found(report, "not_touched") == {("InputBatch", "query_start_loc")}
    assert found(report, "not_in_spec") == set()


def test_types_come_from_annotations_not_variable_names(capsys, tmp_path):
    names = {"input_batch": "ib", "grammar_output": "g", "local_output": "out", "metadata": "plan", "lp": "tensors"}
    pattern = re.compile(r"\b(" + "|".join(names) + r")\b")
    root = copy_tree(tmp_path, lambda t: pattern.sub(lambda m: names[m[1]], t))
    assert "input_batch" not in (root / SHARD_FILE).read_text()
    code, report = run(capsys, root)
    assert (code, report["findings"], report["touched"]) == (0, [], run(capsys, VLLM_TREE)[1]["touched"])


def _zip(path, members):
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in members.items():
            wheel.writestr(name, text)
    return path


def _tree_with_version(tmp_path):
    root = copy_tree(tmp_path)
    (root / "vllm" / "_version.py").write_text("__version__ = version = '0.35.0'\n")
    return root


BAD_INPUTS = {
    "missing": (lambda tmp: tmp / "nope", "no such file or directory"),
    "no vllm folder": (lambda tmp: tmp, "not a vLLM source tree"),
    "tree without the file": (lambda tmp: (tmp / "vllm" / "v1").mkdir(parents=True) or tmp, "no vllm/v1/worker"),
    "other file": (lambda tmp: (tmp / "notes.txt").write_text("x") and tmp / "notes.txt", "not a vLLM source tree"),
    "not a zip": (lambda tmp: (tmp / "a.whl").write_text("x") and tmp / "a.whl", "not a readable wheel"),
    "other wheel": (lambda tmp: _zip(tmp / "b.whl", {"foo/__init__.py": ""}), "not a vLLM wheel"),
    "wheel without the file": (lambda tmp: _zip(tmp / "c.whl", {"vllm/__init__.py": ""}), "no vllm/v1/worker"),
    "not python": (lambda tmp: (tmp / "d.py").write_text("def (") and tmp / "d.py", "cannot be parsed"),
    "not a sharder": (lambda tmp: (tmp / "e.py").write_text("x = 1\n") and tmp / "e.py", "not vLLM's batch_shard"),
    "version without a profile": (_tree_with_version, "vLLM 0.35.0 has no profile"),
}


@pytest.mark.parametrize("make, message", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_exits_2_with_one_line(capsys, tmp_path, make, message):
    assert upstream_main([str(make(tmp_path))]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and message in captured.err
    assert captured.err.startswith("python -m shardspec.conformance upstream: error: ")


def test_an_unknown_profile_and_no_installed_vllm_exit_2(capsys, monkeypatch):
    assert upstream_main([str(SEED_FILE), "--profile", "vllm-9"]) == 2
    assert "unknown profile 'vllm-9'" in capsys.readouterr().err
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert upstream_main(["installed"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_module_command_line(tmp_path):
    command = [sys.executable, "-m", "shardspec.conformance", "upstream"]
    done = subprocess.run([*command, str(SEED_FILE), "--json"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 1 and found(json.loads(done.stdout), "not_touched") == NEW_IN_0_33
    done = subprocess.run([*command, str(tmp_path / "nope")], cwd=tmp_path, capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr.count("\n")) == (2, "", 1)
