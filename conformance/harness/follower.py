"""Following a launch: the frames each rank appends to its file, read as they arrive, by job and rank."""

from __future__ import annotations

import pathlib
import time
from typing import Any

from shardspec.conformance.harness.frames import FrameLog
from shardspec.conformance.harness.transcript import cut_frame, read_frames


class Follower:
    """Reads the ranks' frame files incrementally (the last frame may be half-written); ranks are world ranks,
    in TP groups of ``tp`` consecutive ones."""

    def __init__(self, run_dir: pathlib.Path, name: str, tp: int, groups: int = 1):
        self.run_dir, self.name, self.tp = run_dir, name, tp
        self.paths: list[pathlib.Path] = []  # by world rank
        self.offsets: list[int] = []
        self._grow(tp * groups)
        self.transcripts: dict[int, dict[int, FrameLog]] = {}  # job index -> rank -> frames
        self.ready: set[int] = set()
        self.pids: dict[int, int] = {}
        self.started = self.last_frame = time.monotonic()
        self.heard: dict[int, float] = {}  # rank -> when its last frame arrived
        # (rank, job, when) of each job a rank ended with an error raised inside a collective.
        self.collective_failures: list[tuple[int, int, float]] = []
        # A rank recorded why it left the launch (error, hang, suite failure).
        self.left_on_purpose = False
        self.pending: dict[int, list[str]] = {}  # rank -> unreadable frames not yet given to a job

    def read(self) -> bool:
        """Whether any new frame arrived."""
        new = False
        for rank, path in enumerate(self.paths):
            if not path.exists():
                continue
            with open(path, "rb") as f:
                f.seek(self.offsets[rank])
                chunk = f.read()
            frames, used = read_frames(chunk)
            self.offsets[rank] += used
            for frame in frames:
                self._add(rank, frame)
            if frames:
                self.heard[rank] = time.monotonic()
            new |= bool(frames)
        if new:
            self.last_frame = time.monotonic()
        return new

    def _add(self, rank: int, frame: dict[str, Any]) -> None:
        if "unreadable" in frame:
            self._note(rank, f"rank {rank} sent a frame the judge cannot read: {frame['unreadable']}")
        elif frame.get("event") == "ready":
            self.ready.add(rank)
            self.pids[rank] = frame.get("pid")
            world = frame.get("world_size")
            if isinstance(world, int) and world > len(self.paths) and world % self.tp == 0:
                self._grow(world)  # ranks started by another launcher: a world of several TP groups
        elif frame.get("job") is not None:
            transcript = self.transcripts.setdefault(frame["job"], {}).setdefault(rank, FrameLog())
            for why in self.pending.pop(rank, []):  # the unreadable frame began this job
                transcript.add({"undecodable": why})
            transcript.add(frame)
            if frame.get("error_in_collective"):
                self.collective_failures.append((rank, frame["job"], time.monotonic()))
            if frame.get("timeout") or frame.get("harness_error") or frame.get("aligned") is False:
                self.left_on_purpose = True

    def _grow(self, world: int) -> None:
        for rank in range(len(self.paths), world):
            self.paths.append(self.run_dir / f"{self.name}-rank{rank}.frames")
            self.offsets.append(0)

    @property
    def groups(self) -> int:
        return len(self.paths) // self.tp

    def group_transcripts(self, job: int) -> list[dict]:
        """Per TP group (blocks of tp world ranks), its transcripts of ``job`` by rank in the group."""
        ranks = self.transcripts.get(job, {})
        groups: list[dict] = [{} for _ in range(self.groups)]
        for rank, transcript in ranks.items():
            groups[rank // self.tp][rank % self.tp] = transcript
        return groups

    def _note(self, rank: int, why: str) -> None:
        """A frame of ``rank`` that cannot be read: for the job it is in, or (after that job's last frame)
        for the next job it sends a frame of."""
        open_jobs = [job for job, ranks in self.transcripts.items() if rank in ranks and not ranks[rank].ended]
        if open_jobs:
            self.transcripts[max(open_jobs)][rank].add({"undecodable": why})
        else:
            self.pending.setdefault(rank, []).append(why)

    def note_cut(self, indices: list[int]) -> None:
        """After the launch: a rank's transcript that ends inside a frame, or an unreadable frame no later
        frame placed, belongs to the first of ``indices`` whose last frame that rank never sent."""
        for rank, path in enumerate(self.paths):
            rest = path.read_bytes()[self.offsets[rank] :] if path.exists() else b""
            notes = self.pending.pop(rank, []) + [f"rank {rank}'s transcript is cut: {cut_frame(rest)}"] * bool(rest)
            job = next((i for i in indices if not self._ended(i, rank)), None)
            for why in notes if job is not None else ():
                self.transcripts.setdefault(job, {}).setdefault(rank, FrameLog()).add({"undecodable": why})

    def _finished_step(self, job: int, rank: int) -> bool:
        transcript = self.transcripts.get(job, {}).get(rank)
        return transcript is not None and transcript.finished_step

    def _ended(self, job: int, rank: int) -> bool:
        transcript = self.transcripts.get(job, {}).get(rank)
        return transcript is not None and transcript.ended

    def unanswered_collective(self, silent_s: float, grace_s: float) -> tuple[int, list[int]] | None:
        """(a rank whose collective failed, the peers it waited for) where a rank ended a job with an error
        raised in a collective more than ``grace_s`` ago, and peers of its TP group had then sent nothing for
        ``silent_s`` or more, have sent nothing since and are not in that job's collectives themselves.

        Such a peer cannot be reached by its own watchdog (it holds the GIL, or was stopped): otherwise it
        would have reported by now. A peer silent for less than ``silent_s`` may only be late; one whose
        last frame entered as many collectives as the failed rank's may wait in the same one, and its own
        process-group timeout will report it.
        """
        now = time.monotonic()
        for rank, job, when in self.collective_failures:
            if now - when < grace_s:
                continue
            failed = self.transcripts[job][rank]
            first = rank - rank % self.tp
            silent = [
                peer
                for peer in range(first, first + self.tp)
                if peer != rank
                and when - self.heard.get(peer, self.started) >= silent_s
                and not self._finished_step(job, peer)
                and not self._waits_with(self.transcripts[job].get(peer), failed)
            ]
            if silent:
                return rank, silent
        return None

    @staticmethod
    def _waits_with(peer: FrameLog | None, failed: FrameLog) -> bool:
        """Whether ``peer`` may be waiting in the collective ``failed`` gave up on."""
        return peer is not None and peer.last_was_call and len(peer.wire) >= len(failed.wire)

    def stopped_ranks(self) -> list[int]:
        """Ranks whose process is stopped (``T`` in /proc, e.g. after SIGSTOP)."""
        return [rank for rank, pid in sorted(self.pids.items()) if _process_state(pid) in ("T", "t")]

    def without_heartbeat(self, limit_s: float) -> list[int]:
        """Ranks whose process lives but whose watchdog thread has not run for ``limit_s`` (it touches the
        rank's ``.beat`` file every 0.2 s) while none of its threads runs either: it is stopped, or asleep
        holding the GIL, and cannot report itself. A rank that died, or has not started its watchdog, is not
        one of them; nor is one with a thread running or waiting for a CPU (state R, :func:`_progressing`):
        it computes, perhaps in a long C call that holds the GIL, which a loaded machine stretches past the
        limit (seen at load 10 and 20 on 2 cores); the case timeout ends it if it never returns."""
        now, silent = time.time(), []
        for rank, pid in sorted(self.pids.items()):
            try:
                beat = (self.run_dir / f"{self.name}-rank{rank}.beat").stat().st_mtime
            except OSError:
                continue
            if now - beat >= limit_s and not _progressing(pid):
                silent.append(rank)
        return silent


def _progressing(pid) -> bool:
    """Whether process ``pid`` is gone (None, Z, X: not a hang) or has a thread that runs or waits for a CPU
    or for the disk (R, D). Every thread counts, not only the main one: a rank's main thread waits (S) while
    a helper thread of torch, Triton or the engine computes holding the GIL, and on a loaded machine that
    stretches past the limit too."""
    if _process_state(pid) in (None, "Z", "X"):
        return True
    try:
        tasks = list(pathlib.Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return True  # gone meanwhile
    return any(_process_state(f"{pid}/task/{task.name}") in ("R", "D") for task in tasks)


def _process_state(pid) -> str | None:
    """The state letter of process ``pid`` in /proc (None where it cannot be read: gone, or not a pid)."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError, TypeError):
        return None
