"""A run interrupted (SIGINT, SIGTERM) while its ranks run: every case, judged or not, says how to reproduce it."""

import json

from harness_cases import small_cases, write_cases

from shardspec.conformance.record import FAIL, CaseResult
from shardspec.conformance.runner import RunConfig
from shardspec.conformance.session import ConformanceSession
from shardspec.spec.profiles import DEFAULT_PROFILE


class InterruptedGroup:
    """Judges the first job a failure, then the run is interrupted (as SIGINT raises in the judge)."""

    def describe(self) -> str:
        return "a group interrupted after its first job"

    def run(self, jobs, tp, judge, on_result):
        violation = {"invariant_id": "INV-OWNER", "message": "wrong owner", "rank": 0, "request": None, "field": None}
        on_result(CaseResult(jobs[0].case, jobs[0].choice.label, FAIL, violations=[violation]))
        raise KeyboardInterrupt("SIGINT")

    def close(self) -> None:
        pass


def test_an_interruption_keeps_every_reproduce_command(tmp_path):
    """Fixture cases (``--case ID``) and case files alike: before, 10 of 11 failures printed an empty
    ``reproduce:`` line after an interruption, since the commands were made once a group size had run."""
    files = write_cases(small_cases(2), tmp_path)
    config = RunConfig(
        impls=["reference"],
        case_ids=["tp2-decode", "tp2-reject-slot-unique"],
        case_files=files,
        run_dir=tmp_path / "run",
        json_path=str(tmp_path / "r.json"),
        shrink=False,
    )
    lines: list[str] = []
    session = ConformanceSession(config, log=lines.append)
    session.group = InterruptedGroup()
    try:
        session.run_all()
    except KeyboardInterrupt:
        pass
    assert session.finish(interrupted="SIGINT") == 130
    cases = {c["case_id"]: c for c in json.loads((tmp_path / "r.json").read_text())["sections"][0]["cases"]}
    assert set(cases) == {"tp2-decode", "tp2-reject-slot-unique", *(c.case_id for c in small_cases(2))}
    prefix = f"python -m shardspec.conformance --impl reference --profile {DEFAULT_PROFILE}"
    assert cases["tp2-decode"]["reproduce"] == f"{prefix} --case tp2-decode", cases["tp2-decode"]
    assert cases["tp2-reject-slot-unique"]["reproduce"] == f"{prefix} --case tp2-reject-slot-unique"
    for path in files:
        case_id = path.rsplit("/", 1)[1].removesuffix(".yaml")
        assert cases[case_id]["reproduce"] == f"{prefix} --case-file {path}", cases[case_id]
    text = "\n".join(lines)
    assert "reproduce: python -m shardspec.conformance" in text
    assert "reproduce: \n" not in text + "\n" and not any(line.rstrip().endswith("reproduce:") for line in lines)
