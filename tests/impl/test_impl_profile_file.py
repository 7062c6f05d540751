"""What a profile costs: one file (tests/conformance/data/profiles/position-owner.yaml) that extends
vllm-0.33 and changes one rule, the owner (position_mod_tp). Registered, it runs production and the
reference, which follow it without a line of either changed, and production equals the reference
under it in every output, dtype and wire payload, in all-production and mixed groups.
"""

import pathlib

import numpy as np
import pytest
from impl_steps import DEVICE, all_ranks, assert_traces_equal, mixed, run_case

from shardspec.comm import LoopbackComm
from shardspec.impl import ProductionSharder
from shardspec.reference import ReferenceSharder
from shardspec.spec.case import Case, build_case_inputs
from shardspec.spec.profiles import load_profile_file, rules_of

PROFILE_FILE = pathlib.Path(__file__).parents[1] / "conformance" / "data" / "profiles" / "position-owner.yaml"
PROFILE = load_profile_file(PROFILE_FILE).name
# Slots whose owners by slot would all be rank 0 at tp 2: by position they alternate.
SLOTS = [4, 2, 6, 0, 8]


def _case(case_id: str, **fields) -> Case:
    base = dict(
        case_id=case_id,
        tp_size=2,
        slots=SLOTS,
        num_logits_per_req=[3, 1, 2, 1, 4],
        max_num_reqs=16,
        max_num_logits_per_req=4,
        logprobs_dims=(2, 1),
        nan_tokens=[2],
        rules=rules_of(PROFILE),
    )
    return Case(**{**base, **fields})


CASES = [
    _case("spec"),
    _case("decode", num_logits_per_req=[1] * 5),
    _case("tp3", tp_size=3, slots=[9, 3, 0, 6, 12, 15, 1], num_logits_per_req=[1, 2, 1, 3, 1, 1, 2]),
    _case("empty", slots=[], num_logits_per_req=[]),
    _case("grammar-blocks", grammar_positions=[3, 0, 4], grammar_block_rows=5, num_acceptable_drafts=[1, 0, 2]),
    _case("admitted", admitted_drafts=[2, 0, 1, 0, 1], adaptive_verification=True),
    _case("dtypes", batch_dtypes={"idx_mapping": "int32", "seq_lens": "int64"}),
]


def test_the_file_changes_one_rule_of_its_parent():
    own, parent = rules_of(PROFILE).as_dict(), rules_of("vllm-0.33").as_dict()
    assert {rule for rule in own if own[rule] != parent[rule]} == {"owner"} and own["owner"] == "position_mod_tp"


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.case_id)
def test_production_equals_the_reference_under_the_profile(case):
    inputs = build_case_inputs(case, DEVICE)
    expected = run_case(case, all_ranks("reference"), inputs)
    assert_traces_equal(case, expected, run_case(case, all_ranks("production"), inputs))
    if case.tp_size > 1:
        assert_traces_equal(case, expected, run_case(case, mixed, inputs))


@pytest.mark.parametrize("impl", [ReferenceSharder, ProductionSharder], ids=["reference", "production"])
def test_both_own_requests_by_batch_position(impl):
    case = _case("owners", tp_size=3, slots=[9, 3, 0, 6, 12, 15, 1], num_logits_per_req=[1, 2, 1, 3, 1, 1, 2])
    inputs = build_case_inputs(case, DEVICE)
    positions = np.arange(len(case.slots))
    for rank in range(case.tp_size):
        sharder = impl(16, 4, comm=LoopbackComm(rank, 3), device=DEVICE, rules=rules_of(PROFILE))
        shard = sharder.shard_sampler_inputs(inputs.batch, inputs.grammar)
        owned = positions[positions % 3 == rank]
        assert shard.local_batch.req_ids == [inputs.batch.req_ids[i] for i in owned]
        assert shard.local_batch.idx_mapping_np.tolist() == [case.slots[i] for i in owned]
        rows = np.asarray(case.num_logits_per_req)
        assert shard.metadata.num_logits_per_rank == [int(rows[positions % 3 == r].sum()) for r in range(3)]
        sources = shard.metadata.gathered_src_indices.tolist()
        width = shard.metadata.max_num_reqs_per_rank
        assert sources == [(i % 3) * width + i // 3 for i in positions]
