"""Starting the ranks of a group: ``python -m shardspec.conformance.harness.spawn TP MODULE ARGS...``.

What the suite needs of ``torchrun --standalone``, at a fraction of its cost
on a small machine: torchrun imports torch in one more process and runs a
rendezvous, and every rank imports torch again. This starts the ranks with
the environment ``torch.distributed``'s ``env://`` initialisation reads and,
like torchrun, stops the others once a rank exits with a failure.

On the CPU, ``--serve MODULE ARGS...`` does better: MODULE's ``preload(ARGS)``
imports everything once, then every rank of every group is a fork calling
MODULE's ``main(args)`` (CUDA does not survive a fork: GPUs get processes).
A group per line read from stdin, see :class:`RankServer`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import traceback

from shardspec.conformance.harness.reaper import end_descendants, end_orphans, end_when_asked


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def start_processes(world_size: int, module: str, args: list[str], port: int) -> list[int]:
    ranks = [
        subprocess.Popen(
            [sys.executable, "-u", "-m", module, *args],
            env={**os.environ, **rank_env(rank, world_size, port)},
        )
        for rank in range(world_size)
    ]
    return [proc.pid for proc in ranks]


def preloaded(module_name: str, args: list[str]):
    module = importlib.import_module(module_name)
    if hasattr(module, "preload"):
        module.preload(args)
    sys.stdout.flush()
    return module


def fork_group(module, world_size: int, args: list[str], port: int, log_path: str | None = None) -> list[int]:
    """Fork the ranks, in a process group of their own (the first rank's pid): killing that group ends
    the ranks and leaves this process to serve the next launch."""
    pids = []
    for rank in range(world_size):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's handler is not the rank's
            with contextlib.suppress(OSError):  # the parent may have done it first
                os.setpgid(0, pids[0] if pids else 0)
            os._exit(_run_fork(module, args, rank_env(rank, world_size, port), log_path))
        with contextlib.suppress(OSError):  # the child may have done it first, or exited
            os.setpgid(pid, pids[0] if pids else pid)
        pids.append(pid)
    return pids


def _run_fork(module, args: list[str], env: dict[str, str], log_path: str | None) -> int:
    if log_path:
        log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.dup2(log, 1)
        os.dup2(log, 2)
    os.environ.update(env)
    try:
        code = module.main(args) or 0
    except SystemExit as exc:  # sys.exit(n) in a rank: its status, as an unforked process would exit
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # the rank's failure, reported like an unforked process would, in one write: the
        write_whole(traceback.format_exc())  # ranks append to one log, and their lines would interleave
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def write_whole(text: str, fd: int = 2) -> None:
    """``text`` to ``fd`` in one write (an append no other rank's write interleaves with)."""
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(OSError):
        os.write(fd, text.encode(errors="replace"))


def write_whole_file(path, text: str) -> None:
    """``text`` as the file ``path``, which a reader sees whole or not at all (written aside, then renamed)."""
    partial = pathlib.Path(f"{path}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def wait_polling(proc, timeout: float | None, what: str) -> int:
    """``proc.wait(timeout)`` for a process this one cannot wait for itself: ``proc.poll()`` until it
    returns a status."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while proc.poll() is None:
        if deadline is not None and time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(what, timeout)
        time.sleep(0.02)
    return proc.returncode


def wait_all(pids: list[int]) -> int:
    """Wait for every rank; the first failure stops the others and is the exit status."""
    return wait_group(pids)[0]


def wait_group(pids: list[int], meanwhile=None) -> tuple[int, dict | None]:
    """Like :func:`wait_all`, and which rank failed first and how (``{"rank", "how"}``), if one did.
    ``meanwhile(running)``: called while waiting, every few milliseconds, with the ranks still running."""
    running = set(pids)
    while running:
        pid, status = os.waitpid(-1, os.WNOHANG if meanwhile else 0)
        if pid == 0:
            meanwhile(running)
            time.sleep(0.02)
            continue
        if pid not in running:
            continue
        running.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            for other in running:
                os.kill(other, signal.SIGKILL)
            for other in running:
                os.waitpid(other, 0)
            return (code if code > 0 else 128 - code), {"rank": pids.index(pid), "how": describe_exit(code)}
    return 0, None


def describe_exit(code: int) -> str:
    """``exited with status 3`` or ``was killed by SIGSEGV``, from a waitstatus_to_exitcode value."""
    if code >= 0:
        return f"exited with status {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"


def serve(module_name: str, args: list[str]) -> int:
    """Fork one group per request line ``{"world_size", "args", "log", "exit"}``; the group's exit
    status goes to the file ``exit`` (written whole, by a rename)."""
    end_when_asked()  # a rank's orphans become this process's children, ended with their group or this process
    module = preloaded(module_name, args)
    for line in sys.stdin:
        request = json.loads(line)
        pids = fork_group(module, request["world_size"], request["args"], free_port(), request["log"])
        group = _group_file(pathlib.Path(request["exit"]))
        write_whole_file(group, str(pids[0]))
        # A process a rank left (its daemon, or what it started before it ended) ends at once: it may hold the
        # rank's end of a connection, and a peer would wait for it until its process-group timeout.
        code, culprit = wait_group(pids, meanwhile=lambda running: end_orphans(keep=running))
        end_descendants()  # whatever the ranks started, before the group is said to have ended
        write_whole_file(request["exit"], json.dumps({"code": code, "culprit": culprit}))
    end_descendants()
    return 0


def _group_file(exit_path: pathlib.Path) -> pathlib.Path:
    """Where :func:`serve` writes the process group of the ranks it forked for the group of ``exit_path``."""
    return exit_path.with_name(exit_path.name + ".group")


class ServerProcess:
    """A long-lived process the judge sends requests to, a JSON line each on its stdin (its log: stdout and
    stderr); it ends once its stdin does."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: pathlib.Path):
        self.env = env
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", "-m", *argv],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
                env=env,
            )

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def request(self, request: dict) -> None:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def close(self, timeout_s: float = 10.0) -> None:
        if self.alive:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class RankServer(ServerProcess):
    """A ``--serve`` process: imports once, then starts a group per :meth:`start` in a fraction of a second."""

    def __init__(self, module: str, args: list[str], env: dict[str, str], log_path: pathlib.Path, proc=None):
        """``proc``: the server as already started (one a :mod:`.zygote` forked), else a new process."""
        if proc is None:
            super().__init__([__name__, "--serve", module, *args], env, log_path)
        else:
            self.env, self.proc = env, proc

    def start(self, world_size: int, args: list[str], log_path: pathlib.Path) -> ServedGroup:
        exit_path = log_path.with_suffix(".exit")
        self.request({"world_size": world_size, "args": args, "log": str(log_path), "exit": str(exit_path)})
        return ServedGroup(self.proc, exit_path)


class ServedGroup:
    """One group of a :class:`RankServer`, with the part of ``subprocess.Popen`` the launcher uses;
    :meth:`kill` ends its ranks, and the server lives on for the next launch (no new import of torch)."""

    def __init__(self, server: subprocess.Popen, exit_path: pathlib.Path):
        self.server, self.exit_path, self.pid, self.returncode = server, exit_path, server.pid, None
        self.culprit: dict | None = None  # the rank that failed first, and how

    def kill(self) -> None:
        """SIGKILL to the ranks' process group (the server's, if the ranks never got one); no rank is the
        culprit then: the launcher ended them."""
        if self.poll() is not None:  # ended on its own: its status and culprit stand
            return
        group = _group_file(self.exit_path)
        deadline = time.monotonic() + 5.0
        while not group.exists() and self.server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        with contextlib.suppress(OSError, ValueError):
            os.killpg(int(group.read_text()) if group.exists() else self.server.pid, signal.SIGKILL)
        try:
            self.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()
        self.returncode, self.culprit = -signal.SIGKILL, None

    def poll(self) -> int | None:
        if self.returncode is None and self.exit_path.exists():
            status = json.loads(self.exit_path.read_text())
            self.returncode, self.culprit = status["code"], status["culprit"]
        elif self.returncode is None and self.server.poll() is not None:
            self.returncode = self.server.returncode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        return wait_polling(self, timeout, "rank server group")


def main(argv: list[str]) -> int:
    if argv[0] == "--serve":
        return serve(argv[1], argv[2:])
    world_size, module, args = int(argv[0]), argv[1], argv[2:]
    return wait_all(start_processes(world_size, module, args, free_port()))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
