"""Ranks started by the user's own launcher, on one node or several: ``--launcher external``.

Engines run TP across the GPUs of a node and, on NVLink domains larger than a
node, across nodes. Then the suite does not start the ranks: the judge (the
command line, on rank 0's node) writes the run folder, prints the command
that starts one rank, and judges the frames the ranks write into that
folder, which must be shared by every node (the usual shared file system of
a cluster). Two ways to start the ranks:

- torchrun with a c10d rendezvous, the same command on every node::

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m shardspec.conformance.harness.worker RUN_DIR/tp8 RUN_DIR/tp8/launch0.json

- a Slurm allocation (the rank reads SLURM_PROCID, SLURM_NTASKS and
  SLURM_LOCALID; export MASTER_ADDR and MASTER_PORT of rank 0's node)::

    srun --ntasks 8 --ntasks-per-node 4 \
        python -m shardspec.conformance.harness.worker RUN_DIR/tp8 RUN_DIR/tp8/launch0.json

The suite cannot restart such ranks: after a launch ends early, it writes the
next launch file (the jobs not run yet) and waits for the ranks again.

A world of a multiple of the group size (WORLD_SIZE 8 at ``--tp 2``) holds
several TP groups, blocks of consecutive ranks, as an engine running TP inside
data parallelism does: every group runs every job and is judged, and every
collective on any group but a rank's own TP group fails INV-WIRE-SEQUENCE.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import sys

JOIN_S = 600.0  # how long the judge waits for the user's launcher to start the ranks


class ExternalGroup:
    """The part of ``subprocess.Popen`` the launcher uses, for ranks it did not start."""

    pid = None
    culprit = None

    def __init__(self, command: str):
        self.command = command
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode  # the judge ends the launch when every job is in, or nothing arrives

    def wait(self, timeout: float | None = None) -> int:
        self.returncode = 0
        return 0

    def stop(self) -> None:
        self.returncode = -1  # the ranks are the user's launcher's to stop


def rank_command(run_dir: pathlib.Path, launch_file: pathlib.Path, tp: int) -> str:
    args = ["-m", "shardspec.conformance.harness.worker", str(run_dir), str(launch_file)]
    torchrun = [
        "torchrun",
        "--nnodes",
        "NODES",
        "--nproc-per-node",
        f"{tp}/NODES",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "HOST:PORT",
        *args,
    ]
    srun = ["srun", "--ntasks", str(tp), sys.executable, *args]
    return (
        f"{shlex.join(torchrun)}\n    or: {shlex.join(srun)}\n"
        f"    (a world of k * {tp} ranks holds k TP groups of {tp}, each judged)"
    )


def adopt_slurm_environment(environ=os.environ) -> None:
    """The variables torch.distributed's env:// initialisation reads, from Slurm's, where a rank was
    started by srun rather than torchrun."""
    if "RANK" in environ or "SLURM_PROCID" not in environ:
        return
    environ["RANK"] = environ["SLURM_PROCID"]
    environ["WORLD_SIZE"] = environ.get("SLURM_NTASKS", "1")
    environ["LOCAL_RANK"] = environ.get("SLURM_LOCALID", "0")
    if "MASTER_ADDR" not in environ or "MASTER_PORT" not in environ:
        raise RuntimeError("a rank started by srun needs MASTER_ADDR and MASTER_PORT (rank 0's node and a free port)")
