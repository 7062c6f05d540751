"""The keeper a launch runs under ends every process below it: daemons and ranks in sessions of their own."""

import os
import pathlib
import subprocess
import sys
import textwrap
import time

from shardspec.conformance.harness.reaper import keeper_command, stop_kept

DAEMON = """
import os, pathlib, sys, time
if os.fork() == 0:
    os.setsid()
    daemon = os.fork()
    if daemon == 0:
        while True:
            time.sleep(1)
    pathlib.Path(sys.argv[1]).write_text(str(daemon))  # before the daemon is an orphan
    os._exit(0)
os.wait()
time.sleep(1)
"""

STOPPED = """
import pathlib, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"],
                         start_new_session=True)
pathlib.Path(sys.argv[1]).write_text(str(child.pid))
while True:
    time.sleep(1)
"""


def _alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _script(tmp_path, text):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(text))
    return [sys.executable, str(path), str(tmp_path / "pid")]


def test_a_daemon_left_by_the_command_ends_when_the_command_does(tmp_path):
    proc = subprocess.run(keeper_command(_script(tmp_path, DAEMON)), timeout=60)
    assert proc.returncode == 0
    assert not _alive(int((tmp_path / "pid").read_text()))


def test_a_keeper_asked_to_end_ends_a_stopped_process_in_a_session_of_its_own(tmp_path):
    proc = subprocess.Popen(keeper_command(_script(tmp_path, STOPPED)), start_new_session=True)
    deadline = time.monotonic() + 30
    while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int((tmp_path / "pid").read_text())
    try:
        assert _alive(pid)
        stop_kept(proc)
        assert proc.returncode == 128 + 15
        assert not _alive(pid)
    finally:
        if _alive(pid):
            os.kill(pid, 9)
