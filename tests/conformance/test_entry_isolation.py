"""Each entry of a multi-entry run runs in rank processes of its own (conformance/harness/multiprocess.py):
an implementation that changes its process (patches the reference at import, leaves torch's default dtype
at float64) is judged by its own verdicts, and the entries after it are not judged for what it did."""

import json
import os
import subprocess
import sys

import pytest
from harness_cases import PLUGINS, small_cases, write_cases

pytestmark = pytest.mark.slow

PATCHES_THE_REFERENCE = "patches_the_reference:PatchesTheReference"
FLOAT64_DEFAULT = "float64_default:Float64Default"


@pytest.fixture(scope="module")
def sections(tmp_path_factory):
    folder = tmp_path_factory.mktemp("entries")
    files = write_cases(small_cases(2), folder)
    impls = f"{PATCHES_THE_REFERENCE},{FLOAT64_DEFAULT},reference"
    command = [sys.executable, "-m", "shardspec.conformance", "--impl", impls, "--no-shrink"]
    command += ["--json", str(folder / "r.json"), "--run-dir", str(folder / "run")]
    command += [arg for path in files for arg in ("--case-file", path)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]  # Float64Default fails
    report = json.loads((folder / "r.json").read_text())
    return {s["implementation"]: s["cases"] for s in report["sections"]}


def _verdicts(cases):
    return [(c["case_id"], c["status"]) for c in cases]


def test_the_reference_passes_after_entries_that_poison_their_processes(sections):
    assert _verdicts(sections["reference"]) == [(f"small-tp2-{n}", "pass") for n in (2, 3, 4)]


def test_an_entry_that_patches_the_reference_at_import_is_judged_by_its_own_steps(sections):
    assert _verdicts(sections[PATCHES_THE_REFERENCE]) == [(f"small-tp2-{n}", "pass") for n in (2, 3, 4)]


def test_an_entry_that_changes_the_default_dtype_fails_its_own_later_cases(sections):
    cases = sections[FLOAT64_DEFAULT]
    assert _verdicts(cases) == [("small-tp2-2", "pass"), ("small-tp2-3", "fail"), ("small-tp2-4", "fail")]
    for case in cases[1:]:  # its first step left float64 the default: its own later steps exchange float64 rows
        assert "INV-A2A-LAYOUT" in {v["invariant_id"] for v in case["violations"]}, case["violations"]
