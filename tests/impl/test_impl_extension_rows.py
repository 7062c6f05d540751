"""Extension fields where a rank owns exactly one request with one logits row: that row is sent too."""

from dataclasses import replace

from impl_steps import all_ranks, assert_traces_equal, run_case

from shardspec.fixtures import load_case


def test_a_rank_with_one_row_sends_its_extension_values():
    # tp 2, slots 0, 2 and 1: rank 1 owns one request of one row, rank 0 two.
    case = replace(
        load_case("tp2-extensions"), case_id="tp2-extensions-one-row", slots=[0, 2, 1], num_logits_per_req=[1, 2, 1]
    )
    expected = run_case(case, all_ranks("reference"))
    assert_traces_equal(case, expected, run_case(case, all_ranks("production")))
