"""Collectives behind one small interface.

Implementations call ``all_to_all_single`` and ``all_gather_into_tensor`` on a
:class:`Communicator` instead of ``torch.distributed`` directly, so that the
same code runs in real multi-process groups (:class:`TorchDistComm`), in
one process with every rank as a thread (:class:`LockstepGroup`), and in
single-rank benchmarks that stand in for remote peers (:class:`LoopbackComm`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Protocol

import torch
import torch.distributed as dist


class Communicator(Protocol):
    rank: int
    world_size: int

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
    ) -> None: ...

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor) -> None: ...


def observed(comm, communicator, name: str = "engine communicator"):
    """``communicator`` (an engine's own: vLLM's PyNccl communicator, a custom all-reduce) handed to whoever
    watches ``comm``: under the conformance suite, a proxy whose every call is recorded as a collective of the
    step; anywhere else, ``communicator`` itself. An adapter whose engine exchanges through a communicator of
    its own puts what this returns where the engine looks for it."""
    hand_over = getattr(comm, "observe_communicator", None)
    return communicator if hand_over is None else hand_over(communicator, name)


def start_up(comm):
    """A context in which the collectives an engine issues to start up (building its process groups, agreeing
    on its configuration) are not part of the step: under the conformance suite, honoured while a sharder is
    constructed and nowhere else; anywhere else, nothing."""
    enter = getattr(comm, "start_up", None)
    return contextlib.nullcontext() if enter is None else enter()


class TorchDistComm:
    """Collectives of a torch.distributed process group (gloo, NCCL, ...)."""

    def __init__(self, group: torch.distributed.ProcessGroup | None = None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        # torch >= 2.13 names it all_gather_single and deprecates the old name.
        self._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes):
        dist.all_to_all_single(
            output,
            input,
            output_split_sizes=list(output_split_sizes),
            input_split_sizes=list(input_split_sizes),
            group=self.group,
        )

    def all_gather_into_tensor(self, output, input):
        self._all_gather(output, input.contiguous(), group=self.group)


class LoopbackComm:
    """A single rank that plays every peer with its own data.

    For benchmarks of one rank of a simulated group: every peer is assumed to
    send exactly what this rank sends, so the received buffers have the right
    shapes and the cost is one local copy per collective.
    """

    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes):
        rows = int(input_split_sizes[self.rank])
        start = int(sum(input_split_sizes[: self.rank]))
        # One view and one broadcasting copy: the stand-in costs what one local copy costs.
        _broadcast_copy(output.view(self.world_size, rows, *output.shape[1:]), input[start : start + rows])

    def all_gather_into_tensor(self, output, input):
        _broadcast_copy(output.view(self.world_size, *input.shape), input)


# Collectives move bytes whatever their dtype; torch's broadcasting copy computes an index per element, so
# narrow elements copy at a fraction of the copy rate. Large copies go as 16-byte (or 8-byte) words.
_WIDEN_FROM_BYTES = 1 << 26


def _broadcast_copy(output: torch.Tensor, input: torch.Tensor) -> None:
    """``output[r] = input`` for every r of ``output``'s first dimension."""
    if output.nbytes >= _WIDEN_FROM_BYTES:
        words = _word_dtype(output, input)
        if words is not None:
            output.view(output.shape[0], -1).view(words).copy_(input.reshape(1, -1).view(words))
            return
    output.copy_(input)


def _word_dtype(output: torch.Tensor, input: torch.Tensor) -> torch.dtype | None:
    """The widest dtype that both (contiguous, same dtype) tensors can be viewed as, if wider than theirs."""
    itemsize = input.element_size()
    if input.dtype != output.dtype or not (input.is_contiguous() and output.is_contiguous()):
        return None
    for size, words in ((16, torch.complex128), (8, torch.int64)):
        if (
            size > itemsize
            and input.nbytes % size == 0
            and input.storage_offset() * itemsize % size == 0
            and output.storage_offset() * itemsize % size == 0
        ):
            return words
    return None


class LockstepGroup:
    """Every rank of a group as a thread of one process, one thread at a time.

    Ranks take turns: a rank runs until it enters a collective, then hands the
    turn to the next. Only one rank ever executes, so code that is not
    thread-safe (the Triton interpreter) can run here. A collective completes
    once every rank has entered it. Mismatched collectives (different kinds
    or sizes) raise instead of hanging, and a rank that waits longer than
    ``timeout_s`` raises ``TimeoutError`` naming the ranks that did not arrive.
    """

    def __init__(self, world_size: int, timeout_s: float = 60.0):
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._arrived: dict[int, tuple] = {}
        self._generation = 0
        self._turn = 0
        self._finished: set[int] = set()
        self.error: BaseException | None = None
        # The rank whose own failure broke the group, when there is one.
        self.error_rank: int | None = None

    def comm(self, rank: int) -> _LockstepComm:
        return _LockstepComm(self, rank)

    # -- turn-taking -----------------------------------------------------
    def _next_turn(self) -> None:
        for step in range(1, self.world_size + 1):
            candidate = (self._turn + step) % self.world_size
            if candidate not in self._finished and candidate not in self._arrived:
                self._turn = candidate
                return
        self._turn = -1  # every live rank waits in a collective

    def _wait(self, predicate, rank: int, what: str) -> None:
        if not self._cond.wait_for(lambda: self.error is not None or predicate(), self.timeout_s):
            missing = sorted(set(range(self.world_size)) - set(self._arrived) - self._finished)
            self.error = TimeoutError(
                f"rank {rank} waited {self.timeout_s:.0f}s in {what}; ranks not arrived: {missing}"
            )
            self._cond.notify_all()
        if self.error is not None:
            raise RuntimeError(f"lockstep group failed: {self.error}") from self.error

    def start(self, rank: int) -> None:
        with self._cond:
            self._wait(lambda: self._turn == rank, rank, "start")

    def finish(self, rank: int, error: BaseException | None = None) -> None:
        with self._cond:
            self._finished.add(rank)
            if error is not None and self.error is None:
                self.error, self.error_rank = error, rank
            if self._arrived and len(self._arrived) + len(self._finished) == self.world_size:
                if self.error is None:
                    self.error_rank = rank
                    self.error = RuntimeError(
                        f"rank {rank} finished while rank(s) {sorted(self._arrived)} "
                        "wait in a collective it never entered"
                    )
            elif self._turn == rank:
                self._next_turn()
            self._cond.notify_all()

    def collective(self, rank: int, kind: str, payload, run) -> None:
        """Enter a collective; ``run(payloads)`` executes it once all arrived."""
        with self._cond:
            generation = self._generation
            self._arrived[rank] = (kind, payload)
            if len(self._arrived) + len(self._finished) < self.world_size:
                self._next_turn()
                self._cond.notify_all()
                self._wait(lambda: self._generation != generation, rank, kind)
            else:
                if self._finished:
                    self.error = RuntimeError(
                        f"ranks {sorted(self._finished)} finished while rank(s) {sorted(self._arrived)} wait in {kind}"
                    )
                    self._cond.notify_all()
                    raise self.error
                kinds = {k for k, _ in self._arrived.values()}
                if len(kinds) != 1:
                    self.error = RuntimeError(f"mismatched collectives across ranks: {self._arrived}")
                    self._cond.notify_all()
                    raise self.error
                try:
                    run({r: p for r, (_, p) in self._arrived.items()})
                except BaseException as exc:
                    self.error = exc
                    self._cond.notify_all()
                    raise
                self._arrived = {}
                self._generation += 1
                self._turn = rank
                self._cond.notify_all()
            # Resume only when it is this rank's turn again.
            self._wait(lambda: self._turn == rank, rank, kind)

    def run(self, fn, *args, partial: bool = False) -> list:
        """Run ``fn(comm, *args)`` on every rank; return per-rank results.

        A rank that raises re-raises here, with its rank named. ``partial``:
        return what every rank returned (None for one that raised) even when
        the group broke, for callers whose ``fn`` records its own errors; a
        rank still running after twice the timeout raises all the same.
        """
        results: list = [None] * self.world_size
        errors: dict[int, BaseException] = {}

        def body(rank: int) -> None:
            comm = self.comm(rank)
            try:
                try:
                    self.start(rank)
                except Exception:
                    if not partial:
                        raise
                    # The group broke before this rank's turn: ``fn`` meets that in its first collective
                    # and records it, as for every other failure.
                results[rank] = fn(comm, *args)
                self.finish(rank)
            except BaseException as exc:  # reported below, per rank
                errors[rank] = exc
                self.finish(rank, exc)

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(self.world_size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(self.timeout_s * 2)
        hung = any(t.is_alive() for t in threads)
        timeout = TimeoutError(f"lockstep group did not finish within {self.timeout_s * 2:.0f}s")
        if partial:
            if hung:
                raise timeout
            return results
        if errors:
            culprit = self.error_rank if self.error_rank in errors else min(errors)
            raise RankError(culprit, errors[culprit]) from errors[culprit]
        if self.error_rank is not None:
            raise RankError(self.error_rank, self.error) from self.error
        if hung:
            raise timeout
        return results


class RankError(RuntimeError):
    def __init__(self, rank: int, error: BaseException):
        super().__init__(f"rank {rank} raised {type(error).__name__}: {error}")
        self.rank = rank
        self.error = error


class _LockstepComm:
    def __init__(self, group: LockstepGroup, rank: int):
        self._group = group
        self.rank = rank
        self.world_size = group.world_size

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes):
        payload = (output, input, list(output_split_sizes), list(input_split_sizes))

        def run(payloads):
            world = self.world_size
            for dst in range(world):
                out, _, out_splits, _ = payloads[dst]
                out_offsets = _offsets(out_splits)
                for src in range(world):
                    _, inp, _, in_splits = payloads[src]
                    in_offsets = _offsets(in_splits)
                    if out_splits[src] != in_splits[dst]:
                        raise RuntimeError(
                            f"all_to_all split mismatch: rank {src} sends {in_splits[dst]} rows "
                            f"to rank {dst}, which expects {out_splits[src]}"
                        )
                    rows = in_splits[dst]
                    out[out_offsets[src] : out_offsets[src] + rows].copy_(inp[in_offsets[dst] : in_offsets[dst] + rows])

        self._group.collective(self.rank, "all_to_all_single", payload, run)

    def all_gather_into_tensor(self, output, input):
        def run(payloads):
            shapes = {r: tuple(p[1].shape) for r, p in payloads.items()}
            if len(set(shapes.values())) != 1:
                raise RuntimeError(f"all_gather input shapes differ across ranks: {shapes}")
            for _dst, (out, _) in payloads.items():
                for src in range(self.world_size):
                    out.view(self.world_size, *payloads[src][1].shape)[src].copy_(payloads[src][1])

        self._group.collective(self.rank, "all_gather_into_tensor", (output, input), run)


def _offsets(splits: Sequence[int]) -> list[int]:
    offsets, total = [], 0
    for size in splits:
        offsets.append(total)
        total += size
    return offsets
