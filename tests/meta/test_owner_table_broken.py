"""The owner table's broken entries (conformance/broken/owner_table.py): a sharder that keeps the owners of
its first step's table is right on every single step, the suite's generated ones included, and is caught
(INV-OWNER) only by a run of several steps whose table the engine rewrote in between; one that compares the
tables across ranks is caught on the wire (CL-OWNER-TABLE-AGREEMENT)."""

from dataclasses import replace

import pytest
from bundled import VLLM_034_SHARDED_CACHE

from shardspec.conformance.api import ImplChoice
from shardspec.conformance.broken import BY_NAME, cases
from shardspec.conformance.cases.multistep import multi_step_cases
from shardspec.conformance.cases.strategies import generate_cases
from shardspec.conformance.replay import run_case_in_process
from shardspec.spec.case import case_owners
from shardspec.spec.profiles import rules_of

FIRST_TABLE = ImplChoice(BY_NAME["owners-of-first-table"].target)


def _violated(result) -> set[str]:
    return {v["invariant_id"] for v in result.violations}


def _alone(step):
    """A step of a multi-step case run on a sharder of its own."""
    return replace(step, then=[], continues=None)


def test_the_targeted_steps_change_their_owners_between_steps():
    steps = [cases.OWNER_TABLE_STEPS, *cases.OWNER_TABLE_STEPS.then]
    first = steps[0].owner_table
    for step in steps[1:]:
        assert case_owners(step) != case_owners(replace(step, owner_table=first)), step.slots


@pytest.mark.parametrize("step", range(3))
def test_first_table_owners_pass_each_step_alone(step):
    case = _alone([cases.OWNER_TABLE_STEPS, *cases.OWNER_TABLE_STEPS.then][step])
    result = run_case_in_process(case, FIRST_TABLE)
    assert (result.errors, result.violations) == ([], [])


def test_first_table_owners_pass_the_single_step_cases_of_a_run():
    """The generated cases of a run (tp 2 and 3, seed 0) under the owner table's profile: all single steps."""
    generated = [c for tp in (2, 3) for c in generate_cases(tp, 8, 0, rules_of(VLLM_034_SHARDED_CACHE))]
    assert any(c.owner_table for c in generated)
    for case in [cases.OWNER_TABLE, *generated]:
        result = run_case_in_process(case, FIRST_TABLE)
        assert (result.errors, result.violations) == ([], []), case.case_id


def test_first_table_owners_fail_the_steps_the_engine_rewrote():
    result = run_case_in_process(cases.OWNER_TABLE_STEPS, FIRST_TABLE)
    assert "INV-OWNER" in _violated(result)


def test_first_table_owners_fail_a_generated_multi_step_case():
    case = multi_step_cases(3, 1, 0, rules_of(VLLM_034_SHARDED_CACHE))[0]
    assert len({tuple(sorted((step.owner_table or {}).items())) for step in [case, *case.then]}) > 1
    assert "INV-OWNER" in _violated(run_case_in_process(case, FIRST_TABLE))
    assert _violated(run_case_in_process(case, ImplChoice("reference"))) == set()


def test_comparing_the_owner_tables_across_ranks_is_caught_on_the_wire_alone():
    """CL-OWNER-TABLE-AGREEMENT: ranks given different tables are the caller's fault, and an implementation that
    checks for it anyway, by all-gathering the batch's entries, computes every output right; its extra
    collective is what fails (INV-WIRE-SEQUENCE, and the all-gathers after it are not where the wire checks
    expect theirs)."""
    compares = ImplChoice(BY_NAME["owner-tables-compared-on-the-wire"].target)
    on_the_wire = {"INV-WIRE-SEQUENCE", "INV-WIRE-SAMPLED", "INV-WIRE-LOGPROBS"}
    generated = [
        c for c in generate_cases(3, 4, 0, rules_of(VLLM_034_SHARDED_CACHE)) if c.slots and c.expect_error is None
    ]
    assert generated
    for case in (cases.OWNER_TABLE, *generated):  # an empty batch has no entry to compare
        violated = _violated(run_case_in_process(case, compares))
        assert "INV-WIRE-SEQUENCE" in violated and violated <= on_the_wire, (case.case_id, violated)
