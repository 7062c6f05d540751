"""Mixed entries A/B (even ranks A, odd ranks B) through the command line, in one process.

A broken odd-rank implementation from the corpus must fail the mixed entry
with the invariant that names its defect, while reference/production passes
on the same cases and tp 1 is reported as not applicable.
"""

import json
from dataclasses import replace

from bundled import VLLM_SEED
from harness_cases import write_cases

from shardspec.conformance.broken import BY_NAME, cases
from shardspec.conformance.cli import main

WIRE_BROKEN = BY_NAME["counts-first-on-the-wire"]  # odd ranks pack the sampled buffer differently


def _run(tmp_path, impls, case_list, profile_args=()):
    report = tmp_path / "report.json"
    args = ["--in-process", "--no-shrink", "--impl", impls, "--json", str(report), "--run-dir", str(tmp_path / "run")]
    args += list(profile_args)
    args += [arg for path in write_cases(case_list, tmp_path) for arg in ("--case-file", path)]
    code = main(args)
    data = json.loads(report.read_text())
    return code, {section["implementation"]: section for section in data["sections"]}


def _judged_cells(column):
    """The cells where some case judged the invariant (n/a: none could; not-run: no checker yet)."""
    return {cell for cell in column.values() if cell not in ("n/a", "not-run")}


def _column(section, tp):
    """Invariant -> cell at ``tp``, without the count of cases not run (a number)."""
    return {
        row["invariant"]: row["results"][str(tp)] for row in section["table"] if row["invariant"] != "(cases not run)"
    }


def test_broken_odd_ranks_fail_with_the_defects_invariant(tmp_path, capsys):
    mixed = f"reference/{WIRE_BROKEN.target}"
    code, sections = _run(tmp_path, f"reference/production,{mixed}", [cases.DECODE])
    assert code == 1
    assert WIRE_BROKEN.invariant_id == "INV-WIRE-SAMPLED"
    failing = [row for row, result in _column(sections[mixed], 2).items() if result == "FAIL"]
    assert WIRE_BROKEN.invariant_id in failing, failing
    assert _judged_cells(_column(sections["reference/production"], 2)) == {"pass"}
    assert f"== {mixed}" in capsys.readouterr().out


def test_tp1_is_not_applicable_to_a_mixed_entry(tmp_path, capsys):
    tp1 = replace(cases.DECODE, case_id="decode-tp1", tp_size=1)
    # vllm-seed builds a sharder of one rank (vllm-0.34, the default, and vllm-0.33 refuse it: PRE-TP-SIZE).
    code, sections = _run(tmp_path, "reference,reference/production", [tp1, cases.DECODE], ["--profile", VLLM_SEED])
    assert code == 0
    mixed = sections["reference/production"]
    assert set(_column(mixed, 1).values()) == {"n/a"} and _judged_cells(_column(mixed, 2)) == {"pass"}
    assert "1" in mixed["not_applicable"] and {c["tp"] for c in mixed["cases"]} == {2}
    assert _judged_cells(_column(sections["reference"], 1)) == {"pass"}
    header = [line for line in capsys.readouterr().out.splitlines() if line.startswith("invariant")]
    assert header and all("tp=1" in line for line in header)
