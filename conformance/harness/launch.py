"""Starting and ending the group of ranks of one launch: torchrun, forks of a preloaded rank server, or
ranks an external launcher starts."""

from __future__ import annotations

import atexit
import os
import pathlib
import re
import subprocess
import sys

from shardspec.conformance.harness.external import ExternalGroup, rank_command
from shardspec.conformance.harness.reaper import become_subreaper, end_strays, keeper_command, launch_mark, stop_kept
from shardspec.conformance.harness.spawn import RankServer, ServedGroup, describe_exit
from shardspec.conformance.harness.zygote import Zygote

WORKER = "shardspec.conformance.harness.worker"
ZYGOTE = "zygote"  # the key of the run's zygote among its servers (an entry's key is a tuple of names)


def _rank_server(
    servers: dict, implementations: tuple[str, ...], env: dict[str, str], run_dir: pathlib.Path, name: str
) -> RankServer:
    """The server in ``servers`` that preloaded ``implementations`` (one entry's: no other entry's ranks are
    forked from it), or a new one after it died or the environment changed."""
    server = servers.get(implementations)
    if server is None or not server.alive or server.env != env:
        if server is not None:
            server.close()
        log = run_dir / f"server-{name}.log"
        forked = _zygote(servers, env, run_dir).fork_server(list(implementations), log)
        server = servers[implementations] = RankServer(WORKER, list(implementations), env, log, proc=forked)
        atexit.register(server.close)  # also when the run ends without closing its group
    return server


def _zygote(servers: dict, env: dict[str, str], run_dir: pathlib.Path) -> Zygote:
    """The run's zygote (kept in ``servers`` under ZYGOTE): every entry's server is forked from it, so only
    the first entry pays for importing torch and the suite."""
    zygote = servers.get(ZYGOTE)
    if zygote is None or not zygote.alive or zygote.env != env:
        if zygote is not None:
            zygote.close()
        zygote = servers[ZYGOTE] = Zygote(WORKER, env, run_dir / "zygote.log")
        atexit.register(zygote.close)
    return zygote


def run_zygote(servers: dict, run_dir: pathlib.Path) -> Zygote:
    """The zygote CPU launches of a run fork their rank servers from (started now if it is not yet)."""
    return _zygote(servers, _worker_env("cpu"), run_dir)


class GroupStarter:
    """Starts the group of each launch of one entry: ``torchrun --standalone``, or forks of the entry's
    preloaded rank server on the CPU (a new server after one was killed). CUDA does not survive a fork, so
    ranks on GPUs always get fresh processes."""

    def __init__(
        self,
        run_dir: pathlib.Path,
        device_kind: str,
        launcher: str = "auto",
        log=print,
        servers=None,
        backend=None,
        implementations: tuple[str, ...] = (),
    ):
        """``backend``: the ranks' collective backend (None: NCCL on GPUs, gloo on the CPU);
        ``implementations``: the entry's, which its rank server imports before forking the ranks."""
        if launcher not in ("auto", "torchrun", "fork", "external"):
            raise ValueError(f"launcher {launcher!r}: expected auto, torchrun, fork or external")
        self.run_dir, self.device_kind, self.log = run_dir, device_kind, log
        self.backend = backend or ("gloo" if device_kind == "cpu" else "nccl")
        self.servers = {} if servers is None else servers
        self.implementations = implementations
        self.external = launcher == "external"
        self.use_torchrun = launcher == "torchrun" or (launcher == "auto" and device_kind != "cpu")
        if not self.external:  # a rank that kills what started it leaves its daemons to this process, not init
            become_subreaper()

    def end_strays(self, proc) -> None:
        """Once launch ``proc`` ended: what its ranks left to this process (their server or keeper killed) ends;
        the servers, and ``proc`` if it still runs, are kept."""
        if not self.external:
            keep = {server.proc.pid for server in self.servers.values() if server.alive}
            end_strays(keep | ({proc.pid} if proc.poll() is None else set()))

    def start(self, tp: int, name: str, log_path: pathlib.Path, world: int | None = None):
        """``world`` ranks (default ``tp``), in TP groups of ``tp``."""
        world = tp if world is None else world
        args = [str(self.run_dir), str(self.run_dir / f"{name}.json")]
        env = _worker_env(self.device_kind)
        if self.external:
            command = rank_command(self.run_dir, self.run_dir / f"{name}.json", tp)
            (self.run_dir / f"{name}.command").write_text(command + "\n")
            self.log(f"  waiting for {tp} ranks started by your launcher; on every node run:\n    {command}")
            return ExternalGroup(command)
        if self.use_torchrun:
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--max-restarts",
                "0",
                "--nproc-per-node",
                str(world),
                "-m",
                WORKER,
                *args,
            ]
        elif self.device_kind != "cpu":
            command = [sys.executable, "-m", "shardspec.conformance.harness.spawn", str(world), WORKER, *args]
        else:
            log_path.write_text("")
            server = _rank_server(self.servers, self.implementations, env, self.run_dir, name)
            return server.start(world, args, log_path)
        with open(log_path, "w") as log_file:  # under a keeper, which ends every process of the launch with it
            return subprocess.Popen(
                keeper_command(command),
                stdin=subprocess.DEVNULL,  # nothing of the judge's is held by what a rank starts
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )


def _worker_env(device_kind: str) -> dict[str, str]:
    env = {**os.environ, **launch_mark()}  # the judge's mark on every process of the launch
    env["OMP_NUM_THREADS"] = "1"  # the expectations are computed with one thread too
    if device_kind == "cpu":
        # Ranks on the CPU (no GPU, or fewer GPUs than ranks): Triton kernels
        # can only run in its interpreter there.
        env["TRITON_INTERPRET"] = "1"
    return env


def let_finish(proc, grace_s: float) -> None:
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)


def kill_group(proc) -> None:
    if isinstance(proc, ExternalGroup):
        proc.stop()
        return
    if isinstance(proc, ServedGroup):
        proc.kill()
        return
    stop_kept(proc)  # its keeper ends the launcher, the ranks and whatever they started


def torchrun_culprit(log: str) -> dict | None:
    """The rank whose failure ended a torchrun launch, and how (``{"rank", "how"}``, a world rank), from the
    root cause torchrun prints; None where it printed none."""
    cause = log.partition("Root Cause (first observed failure):")[2]
    rank = re.search(r"^\s*rank\s*:\s*(\d+)", cause, re.MULTILINE)
    code = re.search(r"^\s*exitcode\s*:\s*(-?\d+)", cause, re.MULTILINE)
    if rank is None or code is None:
        return None
    return {"rank": int(rank.group(1)), "how": describe_exit(int(code.group(1)))}


ERROR_LINES = 15  # of a rank's error, in the report of a launch that did not run


def first_error(text: str, lines: int = ERROR_LINES) -> str:
    """The first error a launch log holds: its first traceback, to the exception's line (its first frames and
    its last lines where it is longer than ``lines``); else the log's last lines."""
    rows = text.splitlines()
    start = next((i for i, row in enumerate(rows) if row.startswith("Traceback (most recent call last)")), None)
    if start is None:
        return "\n".join(rows[-lines:])
    end = start + 1
    while end < len(rows) and (rows[end].startswith((" ", "\t")) or not rows[end].strip()):
        end += 1  # the frames; the exception's line is the first one not indented
    block = rows[start : end + 1]
    if len(block) > lines:
        block = block[:3] + ["  ..."] + block[-(lines - 4) :]
    return "\n".join(block)


def tail(path: pathlib.Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
