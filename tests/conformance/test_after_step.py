"""The look after a step: it waits for the threads the step left running (once each), then compares."""

import threading
import time

import torch

from shardspec.comm import LoopbackComm
from shardspec.conformance.harness import after_step
from shardspec.conformance.harness.after_step import AfterStep
from shardspec.conformance.harness.recording import RecordingComm
from shardspec.conformance.harness.snapshots import snapshot
from shardspec.conformance.record import StepOutputs


def _look(recorder, inputs, gathered):
    before, watched = {"batch": snapshot(inputs)}, {"batch": inputs}
    return AfterStep(recorder, before, watched, "c", gathered, "cpu", returned=snapshot(gathered))


def test_a_late_write_by_a_thread_the_step_left_running_is_found():
    recorder = RecordingComm(LoopbackComm(rank=0, world_size=1))
    inputs, gathered = {"ids": torch.zeros(3)}, {"sampled": torch.ones(2, dtype=torch.int64)}

    def late() -> None:
        time.sleep(0.2)
        inputs["ids"][1] = 5.0
        gathered["sampled"][0] = -1

    thread = threading.Thread(target=late)
    recorder.adopt(thread)
    thread.start()
    outputs = StepOutputs()
    changed = _look(recorder, inputs, gathered).finish(outputs)
    assert changed["inputs_modified"] == ["batch.ids (after the step returned)"] == outputs.inputs_modified
    assert changed["held_results_modified"] == [{"field": "c.gathered.sampled", "row": 0}]


def test_a_thread_that_outlives_its_wait_is_not_waited_for_again(monkeypatch):
    monkeypatch.setattr(after_step, "WINDOW_S", 0.2)
    recorder, stop = RecordingComm(LoopbackComm(rank=0, world_size=1)), threading.Event()
    worker = threading.Thread(target=stop.wait, daemon=True)  # a pool's idle worker
    recorder.adopt(worker)
    worker.start()
    try:
        times = []
        for _ in range(2):
            start = time.monotonic()
            _look(recorder, {"ids": torch.zeros(1)}, None).finish(StepOutputs())
            times.append(time.monotonic() - start)
    finally:
        stop.set()
    assert times[0] >= 0.2 > 0.1 > times[1], times
