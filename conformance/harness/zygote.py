"""One preloaded process that forks each entry's rank server: ``python -m shardspec.conformance.harness.zygote MODULE``.

Each entry of a run has rank processes of its own, so that no implementation's import, patch or global
state reaches another entry's ranks; and a rank server that imports torch and the suite itself costs seconds
of CPU on a small machine, once per entry. This process imports MODULE once (torch and the suite, never an
implementation) and forks a rank server per request line ``{"implementations", "requests", "log", "pid",
"status"}``: the server (:func:`.spawn.serve`) imports the entry's implementations, reads its group
requests from the FIFO ``requests`` and logs to ``log``; this process writes its pid to ``pid`` and, once
it ended, its exit status to ``status``. Every entry's server thus starts from a process no implementation
ran in. A request line ``{"probe", "out", "err", "pid", "status"}`` forks a child that tries to load
implementations (:func:`.probe.main` with the arguments ``probe``, its output to ``out`` and ``err``) instead of
a child that imports torch again. This process ends with the judge (``PR_SET_PDEATHSIG``), and its children
with it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from shardspec.conformance.harness.probe import main as probe_main
from shardspec.conformance.harness.reaper import PR_SET_PDEATHSIG, _prctl, running
from shardspec.conformance.harness.spawn import ServerProcess, preloaded, serve, wait_polling, write_whole_file

STARTING_S = 60.0  # a forked server opens its request FIFO within this long, or it is taken as not started
ENDING_S = 10.0


def _become_server(module_name: str, request: dict) -> int:
    """In the forked child: a session of its own (its pid is its process group, which the judge may kill),
    the entry's log as its output, the request FIFO as its input; then a rank server of the entry."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    requests = os.open(request["requests"], os.O_RDONLY)  # until the judge opens it for writing
    os.dup2(requests, 0)
    os.close(requests)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's input, for its whole life)
    return serve(module_name, request["implementations"])


def _become_probe(request: dict) -> int:
    """In the forked child: a session of its own, ``out`` and ``err`` as its output, then the probe (which
    never returns: it ends the process itself)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.setsid()
    for fd, key in ((1, "out"), (2, "err")):
        opened = os.open(request[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(opened, fd)
        os.close(opened)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return probe_main(request["probe"])


def serve_servers(module_name: str) -> int:
    """Fork a rank server per request line read from stdin, until stdin ends; then wait for them."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # no zygote outlives its judge
    if os.getppid() == 1:
        return 1
    preloaded(module_name, [])
    status_of: dict[int, str] = {}

    def reap(signum=None, frame=None) -> None:
        while status_of:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in status_of:
                write_whole_file(status_of.pop(pid), str(os.waitstatus_to_exitcode(status)))

    signal.signal(signal.SIGCHLD, reap)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _become_probe(request) if "probe" in request else _become_server(module_name, request)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        status_of[pid] = request["status"]
        write_whole_file(request["pid"], str(pid))
        reap()
    # stdin ended: the judge closed its servers first; those still running are ended.
    deadline = time.monotonic() + ENDING_S
    while status_of and time.monotonic() < deadline:
        time.sleep(0.02)
        reap()
    for pid in list(status_of):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for pid in list(status_of):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return 0


class ForkedChild:
    """The part of ``subprocess.Popen`` the judge uses of a child the zygote forked: ``pid``, ``poll``,
    ``wait`` and ``returncode`` (the zygote reaps it and writes its exit status to the file ``status``)."""

    def __init__(self, zygote: Zygote, paths: dict[str, str], deadline: float):
        self.paths, self.returncode = paths, None
        pid_path = pathlib.Path(paths["pid"])
        while not pid_path.exists():
            if not zygote.alive or time.monotonic() > deadline:
                raise RuntimeError(f"the rank server zygote forked no child (its log: {zygote.log_path})")
            time.sleep(0.005)
        self.pid = int(pid_path.read_text())

    def poll(self) -> int | None:
        status = pathlib.Path(self.paths["status"])
        if self.returncode is None and status.exists():
            self.returncode = int(status.read_text())
        elif self.returncode is None and not running(self.pid):
            deadline = time.monotonic() + 1.0  # its status follows once the zygote reaped it
            while not status.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            self.returncode = int(status.read_text()) if status.exists() else -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        return wait_polling(self, timeout, "forked child")


class ForkedServer(ForkedChild):
    """A rank server the zygote forked, for :class:`.spawn.RankServer`; ``stdin`` is its request FIFO."""

    def __init__(self, zygote: Zygote, paths: dict[str, str]):
        deadline = time.monotonic() + STARTING_S
        super().__init__(zygote, paths, deadline)
        self.stdin = self._open_requests(deadline)

    def _open_requests(self, deadline: float):
        """The FIFO's writing end, once the server opened its reading end (never blocks on a dead server)."""
        while True:
            try:
                fd = os.open(self.paths["requests"], os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                if self.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the rank server forked for an entry ended before reading its requests (its log: "
                        f"{self.paths['log']})"
                    ) from None
                time.sleep(0.005)
                continue
            os.set_blocking(fd, True)
            return os.fdopen(fd, "w")


class Zygote(ServerProcess):
    """The judge's handle on a zygote process: :meth:`fork_server` per entry; :meth:`close` at the run's end."""

    def __init__(self, module: str, env: dict[str, str], log_path: pathlib.Path):
        super().__init__([__name__, module], env, log_path)
        self.log_path, self.forked = log_path, []

    def fork_server(self, implementations: list[str], log_path: pathlib.Path) -> ForkedServer:
        """A rank server for one entry, forked from this zygote, logging to ``log_path``."""
        base = str(log_path.with_suffix(""))
        paths = {key: f"{base}.{key}" for key in ("requests", "pid", "status")}
        for path in paths.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        os.mkfifo(paths["requests"])
        paths["log"] = str(log_path)
        log_path.write_text("")
        self.request({"implementations": implementations, **paths})
        server = ForkedServer(self, paths)
        self.forked.append(server)
        return server

    def run_probe(self, argv: list[str], timeout_s: float, base: pathlib.Path) -> tuple[str, int | None, str]:
        """:func:`.probe.main` with ``argv`` in a child forked from this zygote (no second import of torch):
        (its output, its exit status or None where it ran past ``timeout_s`` and was killed, its error output).
        ``base``: the path its files start with."""
        paths = {key: f"{base}.{key}" for key in ("out", "err", "pid", "status")}
        for path in paths.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.request({"probe": argv, **paths})
        child = ForkedChild(self, paths, time.monotonic() + STARTING_S)
        try:
            returncode = child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(child.pid, signal.SIGKILL)  # its own session: what it started goes too
            child.wait(ENDING_S)
            returncode = None
        read = (pathlib.Path(paths[key]) for key in ("out", "err"))
        out, err = (path.read_text(errors="replace") if path.exists() else "" for path in read)
        return out, returncode, err

    def close(self, timeout_s: float = ENDING_S + 5) -> None:
        for server in self.forked:  # each server ends once its requests end; the zygote waits for them
            with contextlib.suppress(OSError, ValueError):
                server.stdin.close()
        super().close(timeout_s)


if __name__ == "__main__":
    sys.exit(serve_servers(sys.argv[1]))
