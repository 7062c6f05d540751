"""The paths a GPU run takes, taken on the CPU: CI has no GPU, and a break on these paths once left
every multi-process CUDA run judging no case (a rank's device is a ``torch.device``, a recorded
tensor says ``cuda:0``). Each test below takes the GPU run's path with CPU tensors."""

import pytest
import torch

from shardspec.conformance.cli import main
from shardspec.conformance.harness.expectations import rank_placement
from shardspec.conformance.harness.frames import FrameLog, decode_frames
from shardspec.conformance.harness.launch import GroupStarter
from shardspec.conformance.harness.transcript import ObjectData, TensorData, decode, encode
from shardspec.conformance.run.config import RunConfig
from shardspec.conformance.run.reproduce import mode_args

DEVICE_NAMES = [pytest.param(torch.device("cpu"), id="torch.device"), pytest.param("cpu", id="text")]


def _recorded_on(encoded, device: str):
    """``encoded`` as a rank on ``device`` would have sent it: every device tensor says where it lay."""
    if isinstance(encoded, TensorData):
        encoded.device = device
    elif isinstance(encoded, ObjectData):
        for value in encoded.fields.values():
            _recorded_on(value, device)
    elif isinstance(encoded, (list, tuple)):
        for value in encoded:
            _recorded_on(value, device)
    elif isinstance(encoded, dict):
        for value in encoded.values():
            _recorded_on(value, device)
    return encoded


@pytest.mark.parametrize("device", DEVICE_NAMES)
def test_a_tensor_recorded_on_a_gpu_decodes_for_a_device_named_either_way(device):
    encoded = _recorded_on(encode(torch.arange(6, dtype=torch.int32).view(2, 3)), "cuda:0")
    decoded = decode(encoded, device)
    assert decoded.device == torch.device("cpu")
    assert decoded.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_a_tensor_recorded_on_a_gpu_lands_on_the_host_where_no_gpu_is():
    encoded = _recorded_on(encode(torch.ones(3)), "cuda:1")
    assert decode(encoded).device.type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("device", DEVICE_NAMES)
def test_a_rank_transcript_recorded_on_a_gpu_decodes_for_the_judge(device):
    log = FrameLog()
    log.parts["shard"] = _recorded_on(encode({"send_splits": torch.tensor([1, 2])}), "cuda:0")
    transcript = decode_frames(log, device)
    assert transcript.decode_error is None
    assert transcript.outputs.shard["send_splits"].tolist() == [1, 2]


@pytest.mark.parametrize(
    "world, gpus, share, placement",
    [
        (2, 8, False, ("cuda", "nccl")),
        (2, 2, True, ("cuda", "nccl")),  # enough GPUs: sharing changes nothing
        (2, 1, False, ("cpu", "gloo")),
        (2, 1, True, ("cuda", "gloo")),  # NCCL refuses a second rank on a GPU
        (8, 3, True, ("cuda", "gloo")),
        (2, 0, True, ("cpu", "gloo")),
    ],
)
def test_where_a_launched_world_runs(world, gpus, share, placement):
    assert rank_placement(world, share, num_gpus=gpus) == placement


def test_a_launch_tells_its_ranks_the_backend(tmp_path):
    """The worker initialises its group with the backend the launch file names (harness/worker.py)."""
    assert GroupStarter(tmp_path, "cuda", backend="gloo").backend == "gloo"
    assert GroupStarter(tmp_path, "cuda").backend == "nccl"
    assert GroupStarter(tmp_path, "cpu").backend == "gloo"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--in-process"], "--share-gpus: rank processes that the suite starts with torchrun"),
        (["--launcher", "fork"], "--share-gpus: rank processes that the suite starts with torchrun"),
        pytest.param(
            [],
            "--share-gpus: no CUDA device is available",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here"),
        ),
    ],
)
def test_share_gpus_where_it_cannot_apply_is_one_line(extra, message, capsys):
    assert main(["--share-gpus", *extra, "--case", "tp2-decode"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and message in err, err


def test_a_reproduction_of_a_shared_gpu_run_shares_them_too():
    assert "--share-gpus" in mode_args(RunConfig(share_gpus=True))
    assert "--share-gpus" not in mode_args(RunConfig())
