"""Collectives issued around the recorder are counted by c10d itself (conformance/harness/performed.py): a rank
whose process groups performed more collectives in the step than the recorder saw fails INV-WIRE-SEQUENCE,
whether it switched the recorder off from its own process (``comm._inside.active``), called a backend method
it took at import time, or ran a functional collective with torch's dispatch modes disabled. Each issues one
extra all_reduce of zeros and returns the reference's outputs."""

import json
import os
import subprocess
import sys

import pytest
from harness_cases import PLUGINS, small_cases, write_cases

pytestmark = pytest.mark.slow

MODULE = "unrecorded_collectives"
AROUND_THE_RECORDER = ["RecorderSwitchedOff", "CapturedBackendAllreduce", "DispatchModesDisabled"]


@pytest.fixture(scope="module")
def sections(tmp_path_factory):
    folder = tmp_path_factory.mktemp("unrecorded")
    files = write_cases(small_cases(2), folder)
    impls = ",".join([f"{MODULE}:{name}" for name in AROUND_THE_RECORDER] + ["reference", "production"])
    command = [sys.executable, "-m", "shardspec.conformance", "--impl", impls, "--no-shrink"]
    command += ["--json", str(folder / "r.json"), "--run-dir", str(folder / "run")]
    command += [arg for path in files for arg in ("--case-file", path)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((folder / "r.json").read_text())
    return {s["implementation"]: s["cases"] for s in report["sections"]}


@pytest.mark.parametrize("name", AROUND_THE_RECORDER)
def test_a_collective_issued_around_the_recorder_fails_the_wire_sequence(sections, name):
    cases = sections[f"{MODULE}:{name}"]
    assert [c["status"] for c in cases] == ["fail"] * 3, cases
    for case in cases:
        messages = [v["message"] for v in case["violations"] if v["invariant_id"] == "INV-WIRE-SEQUENCE"]
        assert any("performed 5 collectives in the step, the recorder saw 4" in m for m in messages), messages


@pytest.mark.parametrize("entry", ["reference", "production"])
def test_every_collective_of_a_conforming_step_is_recorded(sections, entry):
    assert [c["status"] for c in sections[entry]] == ["pass"] * 3, sections[entry]
