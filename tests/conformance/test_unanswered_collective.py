"""A rank whose collective timed out waiting for a peer that stays silent ends its launch soon after.

The peer (holding the GIL, or stopped) cannot report itself, and the failed rank's last frame would
otherwise restart the parent's silence clock; these tests follow frame files written here, on a clock
of their own.
"""

import pytest

import shardspec.conformance.harness.follower as follower_module
from shardspec.conformance.harness.follower import Follower
from shardspec.conformance.harness.transcript import write_frame

PG_TIMEOUT_S = 60.0
GRACE_S = 2.0


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(follower_module.time, "monotonic", clock)
    return clock


def _send(tmp_path, rank: int, *frames: dict) -> None:
    with open(tmp_path / f"launch0-rank{rank}.frames", "ab") as stream:
        for frame in frames:
            write_frame(stream, {"rank": rank, **frame})


def _step(name: str) -> dict:
    return {"job": 0, "step": name, "part": None}


CALL = {"job": 0, "call": "all_gather_into_tensor"}
FAILED_IN_COLLECTIVE = {"job": 0, "error_in_collective": True, "aligned": False}


def _both_in_gather(tmp_path, follower, clock, rank_1_entered_it: bool) -> None:
    """Both ranks return from prepare; rank 0 enters the gather's collective, rank 1 too or not, and only
    rank 0 is heard of again, when that collective times out."""
    for rank in (0, 1):
        _send(tmp_path, rank, {"event": "ready", "pid": None, "world_size": 2}, _step("prepare"))
    _send(tmp_path, 0, CALL)
    if rank_1_entered_it:
        _send(tmp_path, 1, CALL)
    follower.read()
    clock.now += PG_TIMEOUT_S
    _send(tmp_path, 0, FAILED_IN_COLLECTIVE)
    follower.read()


def test_a_peer_silent_through_the_timeout_is_out_of_reach_once_the_grace_is_over(tmp_path, clock):
    follower = Follower(tmp_path, "launch0", 2)
    _both_in_gather(tmp_path, follower, clock, rank_1_entered_it=False)
    assert follower.unanswered_collective(PG_TIMEOUT_S / 2, GRACE_S) is None  # within the grace
    clock.now += GRACE_S + 0.1
    assert follower.unanswered_collective(PG_TIMEOUT_S / 2, GRACE_S) == (0, [1])


def test_a_peer_waiting_in_the_same_collective_is_left_to_its_own_timeout(tmp_path, clock):
    follower = Follower(tmp_path, "launch0", 2)
    _both_in_gather(tmp_path, follower, clock, rank_1_entered_it=True)
    clock.now += GRACE_S + 0.1
    assert follower.unanswered_collective(PG_TIMEOUT_S / 2, GRACE_S) is None


def test_a_peer_heard_of_after_the_failure_is_not_out_of_reach(tmp_path, clock):
    follower = Follower(tmp_path, "launch0", 2)
    _both_in_gather(tmp_path, follower, clock, rank_1_entered_it=False)
    clock.now += 1.0
    _send(tmp_path, 1, {"job": 0, "timeout": "rank 1 made no progress", "in_collective": False, "step": "gather"})
    follower.read()
    clock.now += GRACE_S
    assert follower.unanswered_collective(PG_TIMEOUT_S / 2, GRACE_S) is None


def test_a_collective_that_failed_at_once_leaves_a_busy_peer_alone(tmp_path, clock):
    """A collective refusing its arguments fails before the peer could have been waited for."""
    follower = Follower(tmp_path, "launch0", 2)
    for rank in (0, 1):
        _send(tmp_path, rank, {"event": "ready", "pid": None, "world_size": 2}, _step("prepare"))
    _send(tmp_path, 0, CALL, FAILED_IN_COLLECTIVE)
    follower.read()
    clock.now += GRACE_S + 0.1
    assert follower.unanswered_collective(PG_TIMEOUT_S / 2, GRACE_S) is None


def test_only_the_failed_rank_s_tp_group_is_waited_for(tmp_path, clock):
    """World ranks 2 and 3 are another TP group: rank 3's silence is not rank 0's concern."""
    follower = Follower(tmp_path, "launch0", 2, groups=2)
    for rank in range(4):
        _send(tmp_path, rank, {"event": "ready", "pid": None, "world_size": 4}, _step("prepare"))
    _send(tmp_path, 0, CALL)
    _send(tmp_path, 1, CALL)
    follower.read()
    clock.now += PG_TIMEOUT_S
    _send(tmp_path, 0, FAILED_IN_COLLECTIVE)
    follower.read()
    clock.now += GRACE_S + 0.1
    assert follower.unanswered_collective(PG_TIMEOUT_S / 2, GRACE_S) is None


def test_a_live_rank_whose_watchdog_stopped_beating_is_out_of_reach(tmp_path):
    import os
    import subprocess
    import sys
    import time

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    asleep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # like a rank asleep in C
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # running, or waiting for a CPU
    # Its main thread waits (S) for a helper thread that computes: a rank in a torch or Triton worker's work.
    helped = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import threading\nt = threading.Thread(target=lambda: [0 for _ in iter(int, 1)])\nt.start(); t.join()",
        ]
    )
    try:
        follower = Follower(tmp_path, "launch0", 5)
        ranks = ((0, os.getpid()), (1, asleep.pid), (2, int(gone.stdout)), (3, busy.pid), (4, helped.pid))
        for rank, pid in ranks:
            _send(tmp_path, rank, {"event": "ready", "pid": pid, "world_size": 5})
        follower.read()
        assert follower.without_heartbeat(5.0) == []  # no watchdog has started: nothing to judge by
        for rank, _ in ranks:
            (tmp_path / f"launch0-rank{rank}.beat").touch()
        old = time.time() - 6.0
        for rank in (1, 2, 3, 4):
            os.utime(tmp_path / f"launch0-rank{rank}.beat", (old, old))
        deadline = time.monotonic() + 10
        while (_state(asleep.pid), _state(busy.pid), _state(helped.pid)) != (
            "S",
            "R",
            "S",
        ) and time.monotonic() < deadline:
            time.sleep(0.05)  # both past their start (reading files, importing)
        # Rank 0 beats; rank 1 lives, sleeps and has not beaten for 6 s; rank 2's process is gone (it died, not
        # hung); rank 3 has not beaten either but runs (a long C call holding the GIL on a loaded machine);
        # rank 4's main thread waits while its other thread runs.
        assert _state(busy.pid) == "R" and _state(helped.pid) == "S"
        assert follower.without_heartbeat(5.0) == [1]
        assert follower.without_heartbeat(7.0) == []
    finally:
        for proc in (asleep, busy, helped):
            proc.kill()
            proc.wait()


def _state(pid: int) -> str:
    import pathlib

    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
