"""``python -m shardspec.conformance.spawn TP [--fork] MODULE ARGS...``: start TP ranks of MODULE.

What the suite needs of ``torchrun --standalone``, at a fraction of its cost
on a small machine: torchrun imports torch in one more process and runs a
rendezvous, and every rank imports torch again. This starts the ranks with
the environment ``torch.distributed``'s ``env://`` initialisation reads and,
like torchrun, stops the others once a rank exits with a failure.

With ``--fork`` (ranks on the CPU only: CUDA does not survive a fork) the
imports happen once here: MODULE's ``preload(ARGS)`` runs, then every rank is
a fork that calls MODULE's ``main(ARGS)``.
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import time
import traceback


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def start_processes(world_size: int, module: str, args: list[str], port: int) -> list[int]:
    ranks = [subprocess.Popen([sys.executable, "-u", "-m", module, *args],
                              env={**os.environ, **rank_env(rank, world_size, port)})
             for rank in range(world_size)]
    return [proc.pid for proc in ranks]


def start_forks(world_size: int, module_name: str, args: list[str], port: int) -> list[int]:
    module = importlib.import_module(module_name)
    if hasattr(module, "preload"):
        module.preload(args)
    sys.stdout.flush()
    pids = []
    for rank in range(world_size):
        pid = os.fork()
        if pid == 0:
            os._exit(_run_fork(module, args, rank_env(rank, world_size, port)))
        pids.append(pid)
    return pids


def _run_fork(module, args: list[str], env: dict[str, str]) -> int:
    os.environ.update(env)
    try:
        code = module.main(args) or 0
    except BaseException:  # the rank's failure, reported like an unforked process would
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def wait_all(pids: list[int]) -> int:
    """Wait for every rank; the first failure stops the others and is the exit status."""
    running = set(pids)
    while running:
        pid, status = os.waitpid(-1, 0)
        if pid not in running:
            continue
        running.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            for other in running:
                os.kill(other, signal.SIGKILL)
            for other in running:
                os.waitpid(other, 0)
            return code if code > 0 else 128 - code
    return 0


def main(argv: list[str]) -> int:
    world_size, rest = int(argv[0]), argv[1:]
    fork = rest[0] == "--fork"
    module, args = (rest[1], rest[2:]) if fork else (rest[0], rest[1:])
    port = free_port()
    start = start_forks if fork else start_processes
    return wait_all(start(world_size, module, args, port))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
