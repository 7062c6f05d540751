"""Ending everything a launch started: its ranks, and every process they started, daemons included.

A rank may outlive its launcher: torchrun starts each rank in a session of its own, so killing torchrun's
process group leaves a rank that is stopped (SIGSTOP) or holds the GIL running; and an implementation may
start a daemon (a double fork into a session of its own) that no process group or session reaches. So the
harness tracks them itself, whatever the launcher: the process that starts a launch's ranks is a *child
subreaper* (``PR_SET_CHILD_SUBREAPER``), so every process of the launch whose parent ends becomes its child
instead of init's, and when the launch ends it kills every descendant it has (found through ``/proc``),
until none is left, and reaps them. The preloaded rank server (:mod:`.spawn`) does it after each group it
forks (and when it is sent SIGTERM, or the judge that started it dies); every other launch runs under this
module's keeper::

    python -m shardspec.conformance.harness.reaper COMMAND ARGS...

which runs COMMAND (torchrun, or the ranks' own spawner), and when COMMAND exits, or the keeper is asked to
end (SIGTERM, SIGINT, SIGHUP, or the death of the judge that started it), ends every process below it and
exits with COMMAND's status (128 + the signal when it was asked to end).

While a launch runs, an orphan (a process whose parent ended: a daemon, or what a rank that ended had
started) is ended at once, by the server and the keeper alike: it holds a copy of the sockets of the rank
that started it, and a peer of that rank, waiting for it in a collective, would learn it left only once
nothing holds them (at its process-group timeout). A rank's helper processes must stay its children.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

# In the environment of every process a judge launches (its ranks inherit it), the judge's pid: what marks an
# orphan the judge adopted as one of its launches', not one of the other processes it started.
LAUNCH_MARK = "SHARDSPEC_LAUNCHED_BY"
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
ENDING_S = 10.0  # at most this long to kill a launch's processes (each is SIGKILLed: no process can delay it)


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux: descendants are still found while their parents live
        return False


def become_subreaper() -> bool:
    """Orphans among this process's descendants become its children (Linux 3.4+); whether it could."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def running(pid: int) -> bool:
    """Whether ``pid`` runs: neither ended nor a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def descendants(root: int) -> list[int]:
    """The live processes below ``root`` (zombies left out), parents before children, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in (b"Z", b"X"):
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, queue = [], [root]
    while queue:
        for child in children.get(queue.pop(0), ()):
            found.append(child)
            queue.append(child)
    return found


def children(pid: int) -> list[int]:
    """The children of ``pid`` (its adopted orphans included), from /proc's per-thread lists where the
    kernel keeps them (cheap enough to read every few milliseconds), else from every process's parent."""
    found, listed = [], False
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tasks = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as listing:
                found += [int(child) for child in listing.read().split()]
                listed = True
        except OSError:
            continue
    if listed:
        return found
    below = set(descendants(pid))
    return [child for child in below if _parent(child) == pid]


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def end_orphans(keep) -> int:
    """SIGKILL this process's children but ``keep`` (as a subreaper, its other children are orphans: a
    daemon, or what a process that ended started); their children become this process's and are ended by a
    later call. Reaps them; returns how many were killed."""
    killed = 0
    for child in children(os.getpid()):
        if child not in keep:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
                killed += 1
    if killed:
        reap()
    return killed


def reap() -> None:
    """Collect every child of this process that has ended (its adopted orphans included)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end_descendants(timeout_s: float = ENDING_S) -> int:
    """SIGKILL every process below this one until none is left (a process forking meanwhile is found on the
    next pass; as a subreaper, the orphans of those killed are this process's children); reaps them. Returns
    how many were killed."""
    me, killed, deadline = os.getpid(), set(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = descendants(me)
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        reap()
        if not found:
            break
        time.sleep(0.01)
    return len(killed)


def end_when_asked() -> None:
    """Make this process the subreaper of what it starts, ending all of it and itself on SIGTERM, or when the
    judge that started it dies (it is sent SIGTERM then): for a long-lived process that starts launches."""
    become_subreaper()

    def end(signum, frame):
        end_descendants()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, end)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the judge died before the death signal was set
        end(signal.SIGTERM, None)


def launch_mark() -> dict[str, str]:
    """The variable that marks every process of this judge's launches (:func:`end_strays`)."""
    return {LAUNCH_MARK: str(os.getpid())}


def _marked(pid: int, mark: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return mark in environ.read().split(b"\0")
    except OSError:
        return False


def end_strays(keep: set[int], timeout_s: float = ENDING_S) -> int:
    """The judge's part (a subreaper, :func:`become_subreaper`): a rank that killed what started it (the rank
    server, the keeper) leaves its daemons to the judge; each child of this process that carries this judge's
    launch mark and is not in ``keep`` (the servers and keepers it runs) is SIGKILLed with all below it, until
    none is left. Reaps only those. Returns how many were killed."""
    mark = f"{LAUNCH_MARK}={os.getpid()}".encode()
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        strays = [pid for pid in children(os.getpid()) if pid not in keep and _marked(pid, mark)]
        for pid in [below for stray in strays for below in (stray, *descendants(stray))]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        for pid in killed:  # only the judge's own strays: its other children are waited for by their owners
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        if not strays:
            break
        time.sleep(0.01)
    return len(killed)


def keep(command: list[str]) -> int:
    """Run ``command`` as this subreaper's child; once it exits, or this process is asked to end, end every
    process below this one. The status: ``command``'s, or 128 + the signal that asked."""
    become_subreaper()
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # the judge that started this launch died: end it too
    asked: list[int] = []

    def ask(signum, frame):
        asked.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, ask)
    if os.getppid() == 1:  # the judge died before the death signal was set
        return 128 + signal.SIGTERM
    proc = subprocess.Popen(command)
    while proc.poll() is None and not asked:
        # An orphan (a daemon, or what a rank that ended started) ends at once: it may hold the rank's end of a
        # connection, and a peer would wait for it until its process-group timeout.
        end_orphans(keep={proc.pid})
        time.sleep(0.05)
    end_descendants()
    if asked:
        return 128 + asked[0]
    code = proc.returncode
    return code if code >= 0 else 128 - code


def keeper_command(command: list[str]) -> list[str]:
    """``command`` run under the keeper."""
    return [sys.executable, "-m", __name__, *command]


def stop_kept(proc: subprocess.Popen, timeout_s: float = ENDING_S + 5.0) -> None:
    """Ask the keeper ``proc`` to end its launch and wait for it; killed with its process group if it does not
    answer (then only the processes of that group end)."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


if __name__ == "__main__":
    sys.exit(keep(sys.argv[1:]))
