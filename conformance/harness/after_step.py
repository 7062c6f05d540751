"""A step's inputs and result watched after it returned, until its results are handed back.

A thread the step left running, or a copy on a stream nobody synchronised, may write into the step's inputs
or its gathered result a moment after the step returned. The rank compares them with their snapshots once
more at the end of that window: in a multi-process run after the peers finished their step too (the status
exchange between cases), and after waiting (at most :data:`WINDOW_S`) for the threads the step started; on a
GPU after synchronising the device. Only a step that leaves threads running waits; the comparison itself
costs what the first one did.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from shardspec.conformance.harness.held import HeldResults
from shardspec.conformance.harness.snapshots import changed_fields
from shardspec.conformance.record import StepOutputs

# The longest a rank waits, after a step, for the threads that step started.
WINDOW_S = 1.0
# Threads a look after a step waited for already: one that outlived its wait (a pool's idle worker) is not
# waited for again, by any step of this process.
WAITED_FOR: weakref.WeakSet = weakref.WeakSet()
# Said of an input that changed only after the step returned.
LATE = " (after the step returned)"


class AfterStep:
    """What to compare once more after the step: the snapshots of its inputs, a copy of its gathered result,
    the threads it started (its recorder's), and the recording they keep in place until then."""

    def __init__(
        self,
        recorder,
        before: dict[str, Any],
        watched: dict[str, Any],
        case_id: str,
        gathered,
        device,
        release: Callable[[], None] | None = None,
        returned: Any = None,
    ):
        """``returned``: a copy of ``gathered`` made as the gather returned it (else one is made now)."""
        self.recorder, self.before, self.watched, self.device = recorder, before, watched, torch.device(device)
        self.result = HeldResults()
        self.result.hold(case_id, gathered, returned)
        self.release = release
        self.threads = [thread for thread in getattr(recorder, "adopted", []) if thread.is_alive()]

    def finish(self, outputs: StepOutputs) -> dict[str, list]:
        """Waits for the step's threads (at most :data:`WINDOW_S` in all), compares, adds what changed since the
        step returned to ``outputs`` and returns it: ``inputs_modified`` (names) and ``held_results_modified``."""
        try:
            deadline = time.monotonic() + WINDOW_S
            waited = WAITED_FOR
            for thread in self.threads:
                if thread not in waited:
                    thread.join(max(0.0, deadline - time.monotonic()))
                    waited.add(thread)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            inputs = [
                f"{name}{LATE}"
                for key, old in self.before.items()
                for name in changed_fields(key, old, self.watched[key])
                if name not in outputs.inputs_modified
            ]
            results = [change for change in self.result.changed() if change not in outputs.held_results_modified]
        finally:
            self.cancel()
        outputs.inputs_modified += inputs
        outputs.held_results_modified += results
        return {"inputs_modified": inputs, "held_results_modified": results}

    def cancel(self) -> None:
        """Stops recording the step's threads, without comparing (a step that failed)."""
        if self.release is not None:
            self.release()
            self.release = None
