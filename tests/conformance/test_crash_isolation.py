"""A valid case killed by a signal after other cases ran in the same rank processes runs again on its own before
the crash is blamed on it (conformance/harness/crashes.py, suspect_crash): an earlier case may have corrupted
the heap, and glibc aborts in whichever case frees memory next."""

import json
import os
import subprocess
import sys

import pytest
from harness_cases import PLUGINS, small_cases, write_cases

pytestmark = pytest.mark.slow

CRASHES_AFTER_OTHERS = "hostile_sharders:AbortsAfterAnEarlierCase"
CRASHES_ALWAYS = "hostile_sharders:SegfaultInGather"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("isolation")
    cases = small_cases(2)
    assert [c.case_id for c in cases].index("small-tp2-3") > 0  # a case runs before the triggering one
    files = write_cases(cases, folder)
    command = [sys.executable, "-m", "shardspec.conformance", "--impl", f"{CRASHES_AFTER_OTHERS},{CRASHES_ALWAYS}"]
    command += ["--timeout", "20", "--no-shrink", "--json", str(folder / "r.json")]
    command += [arg for path in files for arg in ("--case-file", path)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    report = json.loads((folder / "r.json").read_text())
    return proc, {s["implementation"]: {c["case_id"]: c for c in s["cases"]} for s in report["sections"]}


def test_a_crash_that_an_earlier_case_caused_is_not_blamed_on_the_case(run):
    proc, sections = run
    case = sections[CRASHES_AFTER_OTHERS]["small-tp2-3"]
    assert (case["status"], case["errors"], case["violations"]) == ("pass", [], []), case
    assert "small-tp2-3: a rank was killed by a signal after" in proc.stdout, proc.stdout[-3000:]
    assert all(c["status"] == "pass" for c in sections[CRASHES_AFTER_OTHERS].values())


def test_a_crash_of_the_case_itself_is_blamed_on_it_after_running_alone(run):
    proc, sections = run
    case = sections[CRASHES_ALWAYS]["small-tp2-3"]
    assert case["status"] == "error", case
    first = case["errors"][0]
    assert (first["rank"], first["kind"], first["step"]) == (1, "died", "gather"), case["errors"]
    assert "was killed by SIGSEGV" in first["message"]
    assert proc.returncode == 1
