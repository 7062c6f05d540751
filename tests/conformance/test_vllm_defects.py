"""The vLLM defects the known-failures files list: each has its report, its smallest case, and a check that says
whether it still reproduces (examples/vllm/defects/reproduce.py), which can say no."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest
import yaml

from shardspec.conformance.report.xfails import load_xfails

ROOT = pathlib.Path(__file__).parents[2]
DEFECTS = ROOT / "examples" / "vllm" / "defects"
RELEASES = {"0.33": "vllm-0.33", "0.34": "vllm-0.34"}
SECTIONS = (
    "## What happens",
    "## What the contract expects",
    "## What was observed",
    "## Smallest input",
    "## Reproduce (against the installed package)",
    "## Reachable from vLLM's own model runner?",
)


def _reproduce():
    spec = importlib.util.spec_from_file_location("vllm_defects_reproduce", DEFECTS / "reproduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_every_known_failure_is_a_defect_with_its_report_and_case(release):
    known = load_xfails(str(ROOT / "examples" / "vllm" / f"known_failures_{release}.yaml")).known
    assert known, "the release lists no known failure"
    for item in known:
        assert item.why == "vllm-defect", f"{item.label}: only vLLM defects are known failures, not {item.why}"
        assert item.defect, f"{item.label}: names no report"
        report = (DEFECTS / f"{item.defect}.md").read_text()
        for section in SECTIONS:
            assert section in report, f"{item.defect}.md: no {section!r}"
        command = f"--case-file examples/vllm/defects/{item.defect}.yaml"
        assert command in " ".join(report.split()), f"{item.defect}.md: no reproduction of its case"
        case = yaml.safe_load((DEFECTS / f"{item.defect}.yaml").read_text())
        assert case["id"] == item.defect and case["expect_error"] is None
        named = set(case["spec_refs"]) | {ref for step in case.get("then", []) for ref in step["spec_refs"]}
        assert {i for i in item.invariants if i.startswith("INV-")} & named, f"{item.defect}.yaml names none"


def test_a_defect_reproduces_only_when_every_invariant_of_it_fails():
    reproduce = _reproduce()
    defects = {"a": ("INV-X", "INV-Y"), "b": ("INV-Z",)}
    lines = reproduce.judge(defects, {"a": {"INV-X", "INV-Y", "INV-Q"}, "b": {"INV-X"}})
    assert lines == [
        "reproduces: a (INV-X, INV-Y fail on a.yaml)",
        "does not reproduce: b (INV-Z did not fail on b.yaml)",
    ]
    report = {"sections": [{"cases": [{"case_id": "a.step1", "violations": [{"invariant_id": "INV-X"}]}]}]}
    assert reproduce.failed_invariants(report) == {"a": {"INV-X"}}


def test_the_reference_reproduces_none_of_them():
    """The smallest cases are valid inputs the reference gets right: the check says so, with exit 1."""
    out = subprocess.run(
        [sys.executable, str(DEFECTS / "reproduce.py"), "examples/vllm/known_failures_0.34.yaml"]
        + ["--profile", "vllm-0.34", "--impl", "reference"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if "reproduce" in line]
    assert lines and all(line.startswith("does not reproduce: ") for line in lines), lines
    known = str(ROOT / "examples" / "vllm" / "known_failures_0.34.yaml")
    assert {line.split()[3] for line in lines} == set(_reproduce().defects_of(known))
