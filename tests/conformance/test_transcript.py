"""What cannot cross from a rank to the judge is named, with where it lies and why, and the rest still crosses."""

import io

import numpy as np
import pytest
import torch

from shardspec.conformance.harness.transcript import (
    DecodeError,
    cut_frame,
    decode,
    encode,
    read_frames,
    write_frame,
)


class _Opaque:
    pass


class _Flag(int):
    pass


@pytest.mark.parametrize(
    "value, path, why",
    [
        ({"num_nans": np.array([_Opaque()], dtype=object)}, "[0].num_nans", "a numpy array of dtype object"),
        ({"num_nans": torch.zeros(2, dtype=torch.complex128)}, "[0].num_nans", "a tensor of dtype complex128"),
        ({"ids": np.ma.masked_array([1, 2])}, "[0].ids", "a numpy.ma.MaskedArray (a subclass of numpy.ndarray)"),
        ({"n": [1, _Flag(2)]}, "[0].n[1]", "a _Flag (a subclass of int)"),
    ],
)
def test_what_the_judge_cannot_rebuild_is_named_by_its_path(value, path, why):
    with pytest.raises(DecodeError) as raised:
        decode([encode(value)])
    assert (raised.value.path, raised.value.why.startswith(why)) == (path, True), raised.value


def test_a_frame_the_judge_refuses_does_not_hide_the_frames_after_it():
    import pickle

    stream = io.BytesIO()
    write_frame(stream, {"job": 0, "step": "shard"})
    refused = pickle.dumps({"part": np.array([_Opaque()], dtype=object)})
    stream.write(len(refused).to_bytes(8, "little") + refused)
    write_frame(stream, {"job": 0, "final": True})
    frames, used = read_frames(stream.getvalue())
    assert used == len(stream.getvalue()) and frames[0] == {"job": 0, "step": "shard"}
    assert "could not be read" in frames[1]["unreadable"] and "which the judge never loads" in frames[1]["unreadable"]
    assert frames[2] == {"job": 0, "final": True}


def test_a_cut_frame_says_how_much_of_it_came():
    stream = io.BytesIO()
    write_frame(stream, {"job": 0, "step": "shard"})
    whole = stream.getvalue()
    assert cut_frame(b"") is None
    assert cut_frame(whole[:5]) == "its last frame ends inside its 8-byte header (5 bytes)"
    assert cut_frame(whole[:-3]) == f"its last frame ends after {len(whole) - 11} of {len(whole) - 8} bytes"


def test_a_judge_that_fails_on_a_case_fails_that_case_only():
    from shardspec.conformance.api import ImplChoice
    from shardspec.conformance.broken import cases
    from shardspec.conformance.harness.group import Job
    from shardspec.conformance.harness.settle import Settler

    class FailingJudge:
        device = "cpu"

        def transcripts(self, *args):
            raise KeyError("deliberate")

    results = {}
    Settler([Job(ImplChoice("reference"), cases.DECODE)], results, None, FailingJudge(), None).settle(0, {})
    (error,) = results[0].errors
    assert (results[0].status, error["rank"], error["kind"]) == ("error", None, "harness")
    assert error["message"] == "the judge failed on this case's transcripts: KeyError: 'deliberate'"


def test_device_tensors_land_on_the_judges_device_and_host_tensors_stay_on_the_host():
    """A rank's cuda:N tensor is rebuilt on the judge's device (here the meta device stands in for it); a
    host tensor, such as seq_lens_cpu_upper_bound, stays on the host."""
    from dataclasses import replace

    host = encode(torch.arange(3, dtype=torch.int32))
    on_device = replace(host, device="cuda:1")
    assert decode(host, "meta").device.type == "cpu"
    assert decode(on_device, "meta").device.type == "meta"
