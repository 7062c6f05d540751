"""A case file the suite cannot take is one line naming the file and what is wrong, never a traceback of the
suite's own, nor a run that allocates what the file asks for.

Before, a file nested too deeply ended in a RecursionError traceback; a FIFO or a folder read "no such
file"; ``logprobs_dims`` of a hundred million columns, or a step of a multi-step case beyond the bounds the
first step is held to, went on to build tensors of that size.
"""

import os
from dataclasses import replace

import pytest
from harness_cases import small_cases

from shardspec.conformance.cases.limits import MAX_LOGITS_ELEMENTS
from shardspec.conformance.cli import main
from shardspec.fixtures import case_from_dict, case_to_dict, case_to_yaml
from shardspec.spec.case import Case, build_case_inputs


def _write(case, folder):
    path = folder / f"{case.case_id}.yaml"
    path.write_text(case_to_yaml(case))
    return path


def _refused(path, capsys) -> str:
    assert main(["--in-process", "--case-file", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"--case-file {path}" in err, err
    return err


def test_a_file_nested_too_deeply_is_one_line(tmp_path, capsys):
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 100_000)
    assert "nested too deeply to be a case file" in _refused(path, capsys)


def test_a_fifo_is_not_read(tmp_path, capsys):
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)
    assert "is a FIFO, not a regular file" in _refused(path, capsys)


def test_a_folder_is_named_as_one(tmp_path, capsys):
    path = tmp_path / "folder.yaml"
    path.mkdir()
    assert "is a folder, not a case file" in _refused(path, capsys)


def test_logprobs_wider_than_the_bound_are_refused(tmp_path, capsys):
    path = _write(replace(small_cases(2)[0], case_id="wide", logprobs_dims=(2, 99_999_999)), tmp_path)
    err = _refused(path, capsys)
    assert "logprobs_dims (2, 99999999)" in err and str(MAX_LOGITS_ELEMENTS) in err, err


def test_a_later_step_is_held_to_the_same_bounds(tmp_path, capsys):
    first, second = small_cases(2)[:2]
    step = replace(second, case_id="ignored", vocab_size=10**8)
    path = _write(replace(first, case_id="steps", then=[step]), tmp_path)
    err = _refused(path, capsys)
    assert "step 1: vocab_size 100000000" in err, err


@pytest.mark.parametrize("dims", [(2, 0), (5, 3), None])
def test_ordinary_logprobs_still_run(tmp_path, dims, capsys):
    path = _write(replace(small_cases(2)[0], case_id="ordinary", logprobs_dims=dims), tmp_path)
    assert main(["--in-process", "--case-file", str(path)]) == 0, capsys.readouterr().err


def test_query_lengths_a_case_file_states_are_the_batch_s(tmp_path):
    """A long prefill: the logits row of each request is the last token of its query (query_start_loc)."""
    case = _prefills("long", [5000, 3])
    loaded = case_from_dict(case_to_dict(case), "long.yaml")
    assert loaded.query_lens == [5000, 3]
    batch = build_case_inputs(loaded).batch
    assert batch.query_start_loc.tolist() == [0, 5000, 5003]
    assert batch.logits_indices.tolist() == [4999, 5002]


@pytest.mark.parametrize(
    ("query_lens", "message"),
    [
        ([1, 5, 1], "query_lens: has 3 entries, slots has 2"),
        ([0, 5], "query_lens.0: field query_lens: 0 tokens hold fewer than the request's 1 logits rows"),
        ([1 << 30, 1], "tokens x vocab"),
    ],
)
def test_query_lengths_that_do_not_fit_the_batch_are_refused(tmp_path, capsys, query_lens, message):
    assert message in _refused(_write(_prefills("q", query_lens), tmp_path), capsys)


def _prefills(case_id, query_lens):
    return Case(
        case_id=case_id,
        tp_size=2,
        slots=[2, 0],
        num_logits_per_req=[1, 1],
        query_lens=query_lens,
        max_num_reqs=4,
        max_num_logits_per_req=1,
        vocab_size=8,
    )
